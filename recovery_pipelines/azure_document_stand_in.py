"""A stand-in for Azure AI Document Intelligence's document analysis on 127.0.0.1 that counts what it was asked
(the Azure adapter's provider in the tests and the how-to).

It speaks the wire API the ``azure-ai-documentintelligence`` SDK uses (API version 2024-11-30): ``POST
/documentintelligence/documentModels/{modelId}:analyze`` with an ``AnalyzeDocumentRequest`` (``urlSource``)
answers 202 with an ``Operation-Location`` naming ``.../analyzeResults/{resultId}``, and a GET of that URL
answers the operation (``status`` notStarted, running, succeeded or failed; a succeeded one with its
``analyzeResult``: ``content``, ``pages`` with their ``lines`` and ``words``). Every request must carry the
``Ocp-Apim-Subscription-Key`` it was given; errors are ``{"error": {"code", "message"}}``, and an operation it
does not know is a 404. As the real service, it takes no idempotency key and lists no operations: each POST
starts (and bills) an analysis.

An analysis runs for ``duration`` seconds (``None``: until :meth:`finish_jobs`), then succeeds with the lines
the document was rendered from (as the Textract stand-in reads them: the folder's ``expected.json``, else its
name), or, for a document named in ``fail_first``, its first analysis fails. ``retention`` (seconds) makes a
finished result a 404 that long after it finished, as the real one is after about 24 h; :meth:`forget` does it
at once. ``malformed`` puts other values in every result (``{"confidence": "high"}`` on each word,
``{"pageNumber": "one"}`` on each page, ``{"content": 7}`` in the result and on each line; ``{"status":
"done"}`` in the operation). Crash points: ``hold_create`` (of the ``hold_nth`` analysis) and
``drop_first_create``, as :class:`BatchServer` says. Documents are local files in folders named as blob
containers (``containers={"scans": folder}``: the ``urlSource``
``https://{account}.blob.core.windows.net/scans/{name}``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, unquote

from recovery_pipelines.stand_in_server import BatchServer, QuietHandler
from recovery_pipelines.textract_stand_in import page_count, text_lines

API_VERSION = "2024-11-30"
STAND_IN_KEY = "stand-in-azure-key-0123456789abcdef"


@dataclass
class StandInAnalysis:
    id: str
    model: str
    name: str  # the document's name in its container
    path: Path
    created: float
    status: str = "running"
    finished: float = 0.0
    pages: int = 0
    lines: list[str] | None = None
    known: bool = True


def _stamp(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _odd(value: dict, malformed: Mapping[str, Any]) -> dict:
    return {**value, **{k: v for k, v in malformed.items() if k in value}}


class AzureDocumentProvider(BatchServer):
    def __init__(self, containers: Mapping[str, Path | str], *, duration: float | None = 1.0,
                 fail_first: Iterable[str] = (), retention: float | None = None,
                 malformed: Mapping[str, Any] | None = None, key: str = STAND_IN_KEY, hold_create: float = 0.0,
                 drop_first_create: float = 0.0, hold_nth: int = 1) -> None:
        super().__init__(hold_create, drop_first_create, hold_nth)
        self.containers = {name: Path(folder).resolve() for name, folder in containers.items()}
        self.duration, self.fail_first, self.retention = duration, set(fail_first), retention
        self.malformed, self.key = dict(malformed or {}), key
        self.finished = threading.Event()
        self.gets = 0
        self.results_served: Counter[str] = Counter()  # resultId -> GETs answered with its succeeded result
        self.keys_seen: set[str] = set()  # every key a request carried (a test checks only the right one came)

    def finish_jobs(self) -> None:
        """With ``duration=None``: every analysis started, now or later, ends at its next read."""
        self.finished.set()

    def forget(self, result_id: str) -> None:
        with self.lock:
            self.batches[result_id].known = False

    # -- what it counted ----------------------------------------------------------------------------

    def submissions_per_document(self) -> Counter[str]:
        with self.lock:
            return Counter(a.name for a in self.batches.values())

    def charged(self) -> list[tuple[str, str, int]]:
        """(resultId, document, pages) of each analysis that succeeded (what the service bills)."""
        with self.lock:
            self._settle()
            return [(a.id, a.name, a.pages) for a in self.batches.values() if a.status == "succeeded"]

    def _settle(self) -> None:
        for analysis in self.batches.values():
            self._advance(analysis)

    # -- the API ------------------------------------------------------------------------------------

    def _advance(self, analysis: StandInAnalysis) -> None:
        running = (not self.finished.is_set() if self.duration is None
                   else time.time() < analysis.created + self.duration)
        if analysis.status != "running" or running:
            return
        analysis.finished = time.time()
        first = next(a for a in self.batches.values() if a.name == analysis.name) is analysis
        if first and analysis.name in self.fail_first:
            analysis.status = "failed"
            return
        analysis.pages = page_count(analysis.path)
        analysis.lines = text_lines(analysis.path)
        analysis.status = "succeeded"

    def _document(self, body: Any) -> tuple[str, Path] | None:
        source = body.get("urlSource") if isinstance(body, dict) else None
        url = urlsplit(source) if isinstance(source, str) else None
        parts = unquote(url.path).lstrip("/").split("/", 1) if url is not None else []
        folder = self.containers.get(parts[0]) if len(parts) == 2 else None
        path = (folder / parts[1]).resolve() if folder is not None else None
        if path is None or folder not in path.parents or not path.is_file():
            return None
        return parts[1], path

    def _operation(self, analysis: StandInAnalysis) -> dict[str, Any]:
        self._advance(analysis)
        answer: dict[str, Any] = {"status": analysis.status, "createdDateTime": _stamp(analysis.created),
                                  "lastUpdatedDateTime": _stamp(analysis.finished or analysis.created)}
        if analysis.status == "failed":
            answer["error"] = {"code": "InvalidRequest", "message": "Invalid request.",
                               "innererror": {"code": "InvalidContent",
                                              "message": "The file is corrupted or format is unsupported."}}
        if analysis.status == "succeeded":
            answer["analyzeResult"] = self._result(analysis)
        return _odd(answer, self.malformed)

    def _result(self, analysis: StandInAnalysis) -> dict[str, Any]:
        lines, odd = analysis.lines or [], self.malformed
        content = "\n".join(lines)
        pages = []
        for number in range(1, analysis.pages + 1):
            page_lines = lines if number == 1 else []
            words, offset = [], 0
            for line in page_lines:
                for word in line.split():
                    words.append(_odd({"content": word, "confidence": 0.993, "polygon": [0, 0, 1, 0, 1, 1, 0, 1],
                                       "span": {"offset": offset, "length": len(word)}}, odd))
                    offset += len(word) + 1
            pages.append(_odd({"pageNumber": number, "angle": 0, "width": 8.5, "height": 11, "unit": "inch",
                               "words": words,
                               "lines": [_odd({"content": line, "polygon": [0, 0, 1, 0, 1, 1, 0, 1]}, odd)
                                         for line in page_lines],
                               "spans": [{"offset": 0, "length": len(content)}]}, odd))
        return _odd({"apiVersion": API_VERSION, "modelId": analysis.model, "stringIndexType": "textElements",
                     "content": content, "pages": pages, "contentFormat": "text"}, odd)

    # -- serving ------------------------------------------------------------------------------------

    def handler(self) -> type[QuietHandler]:
        provider = self

        class Handler(QuietHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                url = urlsplit(self.path)
                analyze = re.fullmatch(r"/documentintelligence/documentModels/([\w.-]+):analyze", url.path)
                if not self._authorized():
                    return None
                if analyze is None:
                    return self._error(404, "NotFound", "Resource not found.")
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = None
                document = provider._document(body)
                if document is None:
                    return self._error(400, "InvalidRequest", "Invalid request: urlSource names no document.")
                if not provider.creation_arrived():  # dropped: no analysis exists
                    return self._error(503, "ServiceUnavailable", "The service is temporarily unavailable.")
                with provider.lock:
                    analysis = StandInAnalysis(str(uuid.uuid4()), analyze.group(1), *document, time.time())
                    provider.batches[analysis.id] = analysis
                provider.created()
                location = (f"{provider.url}/documentintelligence/documentModels/{analysis.model}/analyzeResults/"
                            f"{analysis.id}?api-version={API_VERSION}")
                self._send_bytes(202, b"", "application/json", {"Operation-Location": location,
                                                                 "apim-request-id": str(uuid.uuid4())})

            def do_GET(self):
                url = urlsplit(self.path)
                one = re.fullmatch(r"/documentintelligence/documentModels/([\w.-]+)/analyzeResults/([\w-]+)",
                                   url.path)
                if not self._authorized():
                    return None
                with provider.lock:
                    provider.gets += 1
                    analysis = provider.batches.get(one.group(2)) if one else None
                    if analysis is not None and provider.retention is not None and analysis.finished and (
                            time.time() > analysis.finished + provider.retention):
                        analysis.known = False
                    if analysis is None or not analysis.known or analysis.model != one.group(1):
                        return self._error(404, "NotFound", "Resource not found.")
                    answer = provider._operation(analysis)
                    if analysis.status == "succeeded":
                        provider.results_served[analysis.id] += 1
                self._json(200, answer)

            def _authorized(self) -> bool:
                key = self.headers.get("Ocp-Apim-Subscription-Key", "")
                with provider.lock:
                    provider.keys_seen.add(key)
                if key == provider.key:
                    return True
                self._error(401, "401", "Access denied due to invalid subscription key or wrong API endpoint.")
                return False

            def _error(self, status, code, message):
                self._json(status, {"error": {"code": code, "message": message}})

            def _json(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), "application/json",
                                 {"apim-request-id": str(uuid.uuid4())})

        return Handler
