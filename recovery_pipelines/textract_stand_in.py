"""A stand-in for Amazon Textract's asynchronous text detection on 127.0.0.1 that counts what it was asked (the
OCR pipeline's async provider in the tests and the demo).

It speaks the wire API botocore uses for Textract: the AWS JSON 1.1 protocol, ``POST /`` with
``X-Amz-Target: Textract.StartDocumentTextDetection`` or ``Textract.GetDocumentTextDetection`` and a JSON
body, signed (SigV4; any credentials do), errors as ``{"__type": ..., "message": ...}`` with HTTP 400. As the
real service does, a start repeated under the same ``ClientRequestToken`` answers the same ``JobId`` and
starts nothing (with other parameters: ``IdempotentParameterMismatchException``). A job is ``IN_PROGRESS``
for ``duration`` seconds (``None``: until :meth:`finish_jobs`), then ``SUCCEEDED`` with PAGE, LINE and WORD
blocks, read ``MaxResults`` blocks at a time with ``NextToken``; ``fail_first`` names documents whose first job
ends ``FAILED``, ``forget_first`` documents whose first job the service loses once it ran (unknown from then on,
and never billed); :meth:`forget`
makes a job unknown (``InvalidJobIdException``), as its results are after 7 days; ``start_delay`` slows each
start, ``result_delay`` each read of a finished job's blocks. Faults of the service's own: ``repeat_token``
answers every page with the ``NextToken`` it was asked for (or the first one), so a client that follows it
reads for ever; ``odd_fields`` puts other values in the answer (``{"Confidence": "high"}`` on each LINE,
``{"Pages": "two"}`` in its ``DocumentMetadata``).

Buckets are local folders (``buckets={"scans": folder}``); an object's text is what the test data was
rendered from (the folder's ``expected.json`` manifest that ``create_scanned_pdfs`` writes), else its
file name: the stand-in is about the job API, not about recognition.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery_pipelines.stand_in_server import LocalServer, QuietHandler

JSON_11 = "application/x-amz-json-1.1"
PREFIX = "Textract."


class TextractError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass
class StandInJob:
    id: str
    token: str | None
    location: dict
    path: Path
    created: float
    status: str = "IN_PROGRESS"
    pages: int = 0
    blocks: list[dict] | None = None
    known: bool = True


def _geometry(left: float, top: float, width: float, height: float) -> dict:
    return {"BoundingBox": {"Width": width, "Height": height, "Left": left, "Top": top},
            "Polygon": [{"X": left, "Y": top}, {"X": left + width, "Y": top}, {"X": left + width, "Y": top + height},
                        {"X": left, "Y": top + height}]}


def page_count(path: Path) -> int:
    if path.suffix.lower() != ".pdf":
        return 1
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        return len(pdf)
    finally:
        pdf.close()


def text_lines(path: Path) -> list[str]:
    """The lines the document was rendered from (its folder's ``expected.json``), else its name."""
    manifest = path.parent / "expected.json"
    if manifest.exists():
        text = json.loads(manifest.read_text()).get(path.name)
        if text:
            return [line for line in str(text).splitlines() if line.strip()]
    return [path.stem]


def blocks_of(lines: list[str], pages: int) -> list[dict]:
    """PAGE blocks, each LINE of page 1 with its WORD blocks (children), in reading order."""
    blocks: list[dict] = []
    for page in range(1, pages + 1):
        page_block = {"BlockType": "PAGE", "Id": uuid.uuid4().hex, "Page": page,
                      "Geometry": _geometry(0.0, 0.0, 1.0, 1.0), "Relationships": [{"Type": "CHILD", "Ids": []}]}
        blocks.append(page_block)
        for row, line in enumerate(lines if page == 1 else []):
            top = 0.09 + row * 0.045
            words = [{"BlockType": "WORD", "Id": uuid.uuid4().hex, "Page": page, "Text": word, "TextType": "PRINTED",
                      "Confidence": 99.1, "Geometry": _geometry(0.09 + n * 0.1, top, 0.09, 0.02)}
                     for n, word in enumerate(line.split())]
            line_block = {"BlockType": "LINE", "Id": uuid.uuid4().hex, "Page": page, "Text": line, "Confidence": 98.7,
                          "Geometry": _geometry(0.09, top, 0.8, 0.02),
                          "Relationships": [{"Type": "CHILD", "Ids": [w["Id"] for w in words]}]}
            page_block["Relationships"][0]["Ids"].append(line_block["Id"])
            blocks.append(line_block)
            blocks.extend(words)
    return blocks


class TextractProvider(LocalServer):
    def __init__(self, buckets: Mapping[str, Path | str], *, duration: float | None = 1.0,
                 fail_first: Iterable[str] = (), start_delay: float = 0.0, result_delay: float = 0.0,
                 repeat_token: bool = False, odd_fields: Mapping[str, Any] | None = None,
                 forget_first: Iterable[str] = ()) -> None:
        self.repeat_token, self.odd_fields = repeat_token, dict(odd_fields or {})
        self.forget_first = set(forget_first)
        self.buckets = {name: Path(folder).resolve() for name, folder in buckets.items()}
        self.duration, self.fail_first = duration, set(fail_first)
        self.start_delay, self.result_delay = start_delay, result_delay
        self.jobs: dict[str, StandInJob] = {}
        self.by_token: dict[str, str] = {}
        self.starts: Counter[str] = Counter()  # Start requests per ClientRequestToken
        self.gets = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def finish_jobs(self) -> None:
        """With ``duration=None``: every job started, now or later, ends at its next read."""
        self.finished.set()

    # -- what it counted ----------------------------------------------------------------------------

    @property
    def submissions(self) -> int:
        """Jobs started (each one document, each paid)."""
        with self.lock:
            return len(self.jobs)

    def submissions_per_document(self) -> Counter[str]:
        with self.lock:
            return Counter(job.location["S3Object"]["Name"] for job in self.jobs.values())

    def charged(self) -> list[tuple[str, int]]:
        """(object name, pages) of each job that detected its text (what the service bills)."""
        with self.lock:
            for job in self.jobs.values():
                self._advance(job)
            return [(job.location["S3Object"]["Name"], job.pages) for job in self.jobs.values()
                    if job.status == "SUCCEEDED"]

    def statuses(self) -> Counter[str]:
        with self.lock:
            for job in self.jobs.values():
                self._advance(job)
            return Counter(job.status for job in self.jobs.values())

    def forget(self, job_id: str) -> None:
        """The job's results are gone (after 7 days at the real service): asking for it is an error."""
        with self.lock:
            self.jobs[job_id].known = False

    # -- the API ------------------------------------------------------------------------------------

    def _advance(self, job: StandInJob) -> None:
        running = (not self.finished.is_set() if self.duration is None
                   else time.time() < job.created + self.duration)
        if job.status != "IN_PROGRESS" or running:
            return
        name = job.location["S3Object"]["Name"]
        first = next(j for j in self.jobs.values() if j.location["S3Object"]["Name"] == name) is job
        if first and name in self.fail_first:
            job.status = "FAILED"
            return
        if first and name in self.forget_first:  # the service lost it: unknown from now on, never billed
            job.known = False
            return
        job.pages = page_count(job.path)
        job.blocks = blocks_of(text_lines(job.path), job.pages)
        job.status = "SUCCEEDED"

    def _object(self, location: Any) -> Path:
        s3 = location.get("S3Object") if isinstance(location, dict) else None
        folder = self.buckets.get(str((s3 or {}).get("Bucket")))
        name = str((s3 or {}).get("Name") or "")
        path = (folder / name).resolve() if folder is not None and name else None
        if path is None or folder not in path.parents or not path.is_file():
            raise TextractError("InvalidS3ObjectException",
                                "Unable to get object metadata from S3. Check object key, region and/or access "
                                "permissions.")
        return path

    def start(self, body: dict) -> dict:
        time.sleep(self.start_delay)  # a slow service: a kill can fall between one document's start and the next
        token = body.get("ClientRequestToken")
        location = body.get("DocumentLocation")
        with self.lock:
            if token:
                self.starts[token] += 1
                known = self.by_token.get(token)
                if known is not None:
                    if self.jobs[known].location != location:
                        raise TextractError("IdempotentParameterMismatchException",
                                            "The ClientRequestToken was used with different parameters.")
                    return {"JobId": known}
            path = self._object(location)
            job = StandInJob(uuid.uuid4().hex + uuid.uuid4().hex, token, location, path, time.time())
            self.jobs[job.id] = job
            if token:
                self.by_token[token] = job.id
            return {"JobId": job.id}

    def get(self, body: dict) -> dict:
        if int(body.get("MaxResults") or 1000) > 1:  # a read of the blocks, not a status poll (MaxResults=1)
            time.sleep(self.result_delay)
        with self.lock:
            self.gets += 1
            job = self.jobs.get(str(body.get("JobId")))
            if job is None or not job.known:
                raise TextractError("InvalidJobIdException", "An invalid job identifier was passed.")
            self._advance(job)
            if job.status != "SUCCEEDED":
                answer: dict[str, Any] = {"JobStatus": job.status, "DetectDocumentTextModelVersion": "1.0"}
                if job.status == "FAILED":
                    answer["StatusMessage"] = "Request has unsupported document format"
                return answer
            size = min(int(body.get("MaxResults") or 1000), 1000)
            start = int(str(body.get("NextToken") or "p0")[1:])
            blocks = job.blocks or []
            page = [{**b, **{k: v for k, v in self.odd_fields.items() if k in b}} if b["BlockType"] == "LINE" else b
                    for b in blocks[start:start + size]]
            pages = self.odd_fields.get("Pages", job.pages)
            answer = {"JobStatus": "SUCCEEDED", "DocumentMetadata": {"Pages": pages},
                      "DetectDocumentTextModelVersion": "1.0", "Blocks": page}
            if start + size < len(blocks):
                answer["NextToken"] = str(body.get("NextToken") or "p0") if self.repeat_token else f"p{start + size}"
            return answer

    # -- serving ------------------------------------------------------------------------------------

    def handler(self) -> type[QuietHandler]:
        operations = {"StartDocumentTextDetection": self.start, "GetDocumentTextDetection": self.get}

        class Handler(QuietHandler):

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target = self.headers.get("X-Amz-Target", "")
                operation = operations.get(target[len(PREFIX):]) if target.startswith(PREFIX) else None
                try:
                    if not self.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256"):
                        raise TextractError("MissingAuthenticationTokenException", "Missing Authentication Token")
                    if self.path != "/" or operation is None or not self.headers.get("Content-Type", "").startswith(
                            JSON_11):
                        raise TextractError("UnknownOperationException", f"unknown operation {target!r}")
                    self._send(200, operation(json.loads(raw or b"{}")))
                except TextractError as exc:
                    self._send(400, {"__type": exc.kind, "message": exc.message})

            def _send(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), JSON_11,
                                 {"x-amzn-RequestId": str(uuid.uuid4())})

        return Handler


# botocore's client against the stand-in: any region, dummy credentials (it checks only that requests are signed).
STAND_IN_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIDSTANDIN", "AWS_SECRET_ACCESS_KEY": "stand-in",
                        "AWS_DEFAULT_REGION": "us-east-1"}
