"""Azure AI Document Intelligence's document analysis as a provider job (see :func:`run_provider_job`).

Azure analyses one document per operation (``begin_analyze_document``: ``POST
{endpoint}/documentintelligence/documentModels/{modelId}:analyze``, answered 202 with an ``Operation-Location``
naming ``.../analyzeResults/{resultId}``), so a provider job here is a group of them, one per item, submitted
one after the other. The group's id is the JSON of the model and each item's ``resultId``, written to the store
once every document has one; the adapter reads each result with a GET of that URL through the client's own
pipeline (its credential, retries and logging policies), never through the SDK's background poller.

**What cannot be re-attached.** The API takes no idempotency key and lists no analyses: an analysis whose
202 was lost to a crash can be neither found nor re-attached. So the adapter submits by parts
(``submit_by_parts``): the jobs API records each document's ``resultId`` (fenced) as its 202 arrives, and
marks each document before its POST goes out. A resume re-uses the analyses already accepted and submits the
rest; only the one document whose POST was on its way at the crash can be analysed, and billed, twice. The
ledger names it: one row ``unfindable_submission`` whose note says it *may* have been paid twice (whether the
POST reached Azure cannot be known: a crash after the mark and before the request left leaves the same trace);
a crash before any document was marked names none.

Everything else is as for Textract: a document whose analysis ``failed`` is an item error (``azure_failed``,
the service's code and message in the note), one whose result is gone (404: Azure keeps a result about 24 h)
is ``job_gone``, and the jobs API resubmits those items only. A result is read within :class:`ReadLimits`
(bytes and time; one page per document) and every field read is checked: a body past a limit or one that
does not parse is that document's error (``unbounded_result``, ``unreadable_result``) with a note naming its
``resultId``. Azure has no status read without the result: ``status`` keeps the operations it read of the
polled group's finished analyses (at most one document's byte limit of them) and ``results`` takes each from
there, once, instead of reading it again. The key stays in the client's ``AzureKeyCredential``: the adapter
never holds or shows it. ``azure-ai-documentintelligence`` is imported only by :meth:`AzureDocumentJobs.connect`
and when a document is submitted or read (the ``azure`` extra).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError
from recovery_ext._providers.jobs import (
    COMPLETED,
    EXPIRED,
    FAILED,
    JOB_GONE,
    RUNNING,
    UNFINDABLE,
    DocumentResults,
    JobResult,
    ReadLimits,
    ResultUnreadable,
    note,
    number_field,
    whole_field,
)

API_VERSION = "2024-11-30"  # the azure-ai-documentintelligence 1.0 SDK's GA version
# Azure's analysis statuses (its wire words, not ours): whether each is still running
_AZURE_STATUSES = {"notStarted": True, "running": True, "succeeded": False, "failed": False, "canceled": False}
_RUNNING = {status for status, running in _AZURE_STATUSES.items() if running}
_FINISHED = {status for status, running in _AZURE_STATUSES.items() if not running}
_GONE = "gone"              # 404: not one of Azure's statuses
_UNREADABLE = "unreadable"  # its answer did not parse or went past the limits: the read says why
_RESULT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class AzureDocumentJobs:
    """Documents (each an ``AnalyzeDocumentRequest`` as JSON: ``{"urlSource": ...}`` or ``{"base64Source":
    ...}``, or the document's bytes) analysed by ``model_id`` (``prebuilt-read``: text and lines), one Azure
    operation each, grouped as one provider job, through ``client`` (a ``DocumentIntelligenceClient``). Each
    item's answer is ``{"text", "lines", "pages", "confidence", "result_id", "model"}`` (``text`` the result's
    ``content``; ``confidence`` the mean of its words', 0 to 1). ``price_per_page`` prices each document in
    the ledger; ``analyze_options`` go to each ``begin_analyze_document`` (``pages``, ``locale``,
    ``features``, ...)."""

    provider = "azure-document"

    def __init__(self, client: Any, *, model_id: str = "prebuilt-read", price_per_page: float | None = None,
                 analyze_options: Mapping[str, Any] | None = None, limits: ReadLimits | None = None) -> None:
        if not isinstance(model_id, str) or not _RESULT_ID.fullmatch(model_id):
            raise ConfigurationError(f"AzureDocumentJobs(model_id=...) must be a model id, got {model_id!r}")
        if price_per_page is not None and (isinstance(price_per_page, bool) or price_per_page < 0):
            raise ConfigurationError(f"AzureDocumentJobs(price_per_page=...) must be >= 0, got {price_per_page!r}")
        self.client, self.model_id, self.price_per_page = client, model_id, price_per_page
        self.analyze_options = dict(analyze_options or {})
        self.limits = limits or ReadLimits()  # per document: its result's bytes, the time to read it
        # The SDK keeps its endpoint and API version in its configuration only; the adapter needs both (the
        # ledger's endpoint, the results' URL): read there, never the credential beside them.
        config = getattr(client, "_config", None)
        self.endpoint = redact_url(str(getattr(config, "endpoint", "") or ""))
        self.api_version = str(getattr(config, "api_version", None) or API_VERSION)
        self._states: dict[str, str] = {}   # resultId -> a finished analysis' state: not asked again
        self._kept: _KeptOperations | None = None  # what status() read of the polled job's finished analyses

    @classmethod
    def connect(cls, *, endpoint: str, key: str | None = None, credential: Any = None,
                **options: Any) -> AzureDocumentJobs:
        """A ``DocumentIntelligenceClient`` (the ``azure`` extra) with azure-core's standard retries, under an
        ``AzureKeyCredential`` of ``key`` or a token ``credential`` (e.g. ``DefaultAzureCredential()``); the
        adapter keeps neither."""
        try:
            from azure.ai.documentintelligence import DocumentIntelligenceClient
            from azure.core.credentials import AzureKeyCredential
        except ImportError as exc:
            raise ConfigurationError("AzureDocumentJobs.connect needs azure-ai-documentintelligence: "
                                     "pip install 'recovery-ext[azure]'") from exc
        if (key is None) == (credential is None):
            raise ConfigurationError("AzureDocumentJobs.connect needs key=... or credential=..., one of them")
        return cls(DocumentIntelligenceClient(endpoint, AzureKeyCredential(key) if key is not None else credential),
                   **options)

    # -- the JobAdapter protocol --------------------------------------------------------------------

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        return self.submit_by_parts(requests, token, {}, lambda item, part: None)

    def submit_by_parts(self, requests: Mapping[str, Any], token: str, accepted: Mapping[str, str],
                        progress: Callable[[str, str | None], None]) -> str:
        """One analysis per document not ``accepted`` yet (those re-used), each reported to ``progress``
        before it is sent and once its 202 named its ``resultId``: the jobs API records both before the next
        document goes out, so a crash loses the answer to one POST at most."""
        ids: dict[str, str] = {}
        for key, document in requests.items():
            if key in accepted:
                ids[key] = _checked_id(str(accepted[key]), key)
                continue
            body = _body(key, document)
            progress(key, None)
            # polling=False: the SDK's poller would poll from a thread of its own; the jobs API polls instead
            poller = self.client.begin_analyze_document(self.model_id, body, polling=False, **self.analyze_options)
            ids[key] = _operation_id(poller, key)
            progress(key, ids[key])
        return json.dumps({"model": self.model_id, "results": ids}, separators=(",", ":"))

    def find(self, token: str) -> str | None:
        """Nothing can be found: Azure takes no idempotency key and lists no analyses. The resume submits the
        documents it has no ``resultId`` of (``submit_by_parts``); the jobs API ledgers the one that was on its
        way as possibly paid twice."""
        return None

    def status(self, job_id: str) -> str:
        model, documents, _ = _group(job_id)
        if self._kept is None or self._kept.job_id != job_id:  # one job's at a time: the one being polled
            self._kept = _KeptOperations(job_id, self.limits.bytes)
        states = [self._state(model, result_id, self._kept) for result_id in documents.values()]
        if any(state in _RUNNING for state in states):
            return RUNNING
        if all(state in ("succeeded", _UNREADABLE) for state in states):
            return COMPLETED
        if all(state in ("succeeded", _UNREADABLE, _GONE) for state in states):
            return EXPIRED
        return FAILED

    def results(self, job_id: str) -> Mapping[str, JobResult]:
        """Each document's answer, read from Azure when it is first asked for (see :class:`DocumentResults`)."""
        model, documents, unfound = _group(job_id)
        # "unfound": a group id written before submit_by_parts (its whole group was submitted again)
        strays = [JobResult(error=UNFINDABLE, model=model, note=note(
            f"azure submission {unfound}", f"{key!r} may have been analysed, and paid, twice: the answer to its "
            "first submission was lost to a crash, and Azure lists no analyses to re-attach to"))
            for key in documents] if unfound else []
        # the operations status() already read are read from there (each once, then dropped), not GET again
        kept = self._kept if self._kept is not None and self._kept.job_id == job_id else None
        self._kept = None
        return DocumentResults(lambda result_id: self._document(
            model, result_id, kept.take(result_id) if kept is not None else None), documents, strays)

    # -- one document's analysis --------------------------------------------------------------------

    def _get(self, model: str, result_id: str, where: str) -> tuple[dict[str, Any] | None, int]:
        """The analysis' operation as JSON, read within the limits, and its size in bytes; None when Azure no
        longer knows it."""
        from azure.core.rest import HttpRequest

        request = HttpRequest("GET", f"/documentModels/{quote(model, safe='')}/analyzeResults/"
                                     f"{quote(result_id, safe='')}", params={"api-version": self.api_version})
        budget = self.limits.reading(where)
        response = self.client.send_request(request, stream=True)
        try:
            if response.status_code in (404, 410):
                return None, 0
            if response.status_code != 200:
                response.read()
                response.raise_for_status()  # azure-core's HttpResponseError, classified as its status says
            budget.page()
            body = bytearray()
            for chunk in response.iter_bytes():
                budget.page(len(chunk))
                budget.pages -= 1  # a chunk is bytes and time, not a page
                body += chunk
        finally:
            response.close()
        try:
            answer = json.loads(bytes(body))
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ResultUnreadable(f"{where}: the operation is not a JSON object: {bytes(body[:200])!r}")
        return answer, len(body)

    def _state(self, model: str, result_id: str, kept: _KeptOperations) -> str:
        if result_id in self._states:
            return self._states[result_id]
        where = f"azure analysis {result_id}"
        try:
            answer, size = self._get(model, result_id, where)
            state = _GONE if answer is None else _status(where, answer)
        except ResultUnreadable:
            answer, state = None, _UNREADABLE  # the job ended as far as it can be known: reading it says why
        if state not in _RUNNING:
            self._states[result_id] = state
            if answer is not None:
                kept.keep(result_id, answer, size)
        return state

    def _document(self, model: str, result_id: str, read: dict[str, Any] | None = None) -> JobResult | None:
        """One document's answer, from the operation ``read`` by status() if it kept it, else read now."""
        where = f"azure analysis {result_id}"
        try:
            answer = read if read is not None else self._get(model, result_id, where)[0]
            if answer is None:
                return JobResult(error=JOB_GONE, model=model, note=note(
                    where, "Azure no longer knows the analysis (404; results are kept about 24 h)"))
            state = _status(where, answer)
            if state in _RUNNING:
                return None
            if state != "succeeded":
                error = answer.get("error")
                said = (f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict)
                        else f"the analysis ended {state}")
                return JobResult(error=f"azure_{state}", model=model, note=note(where, said))
            return self._answer(model, result_id, where, answer.get("analyzeResult"))
        except ResultUnreadable as exc:
            return JobResult(error=exc.category, model=model, note=note(where, exc.message.removeprefix(where + ": ")))

    def _answer(self, model: str, result_id: str, where: str, result: Any) -> JobResult:
        if not isinstance(result, dict):
            raise ResultUnreadable(f"{where}: analyzeResult is {type(result).__name__}, not an object")
        content = _text(where, "analyzeResult.content", result.get("content"))
        pages = result.get("pages") or []
        if not isinstance(pages, list):
            raise ResultUnreadable(f"{where}: analyzeResult.pages is {type(pages).__name__}, not a list")
        lines: list[dict[str, Any]] = []
        confidences: list[float] = []
        for page in pages:
            if not isinstance(page, dict):
                raise ResultUnreadable(f"{where}: a page is {type(page).__name__}, not an object")
            number = whole_field(where, "a page's pageNumber", page.get("pageNumber"), default=1)
            lines += [{"text": _text(where, "a line's content", _field(where, "a line", line, "content")),
                       "page": number} for line in _list(where, "a page's lines", page.get("lines"))]
            for word in _list(where, "a page's words", page.get("words")):
                confidence = number_field(where, "a word's confidence", _field(where, "a word", word, "confidence"),
                                          default=1.0)
                if not 0 <= confidence <= 1:
                    raise ResultUnreadable(f"{where}: a word's confidence is {confidence!r}, not 0 to 1")
                confidences.append(confidence)
        answered_model = _text(where, "analyzeResult.modelId", result.get("modelId")) or model
        answer = {"text": content, "lines": lines, "pages": len(pages),
                  "confidence": sum(confidences) / len(confidences) if confidences else 0.0,
                  "result_id": result_id, "model": answered_model}
        cost = len(pages) * self.price_per_page if self.price_per_page is not None else None
        return JobResult(answer=answer, model=answered_model, cost=cost)


class _KeptOperations:
    """The operations status() read of one job's finished analyses, so that results() does not GET each a
    second time (Azure has no status read without the result): at most ``limit`` bytes of them (one
    document's read limit), each dropped once results() took it."""

    def __init__(self, job_id: str, limit: int) -> None:
        self.job_id, self.limit, self.size = job_id, limit, 0
        self._operations: dict[str, tuple[dict[str, Any], int]] = {}

    def keep(self, result_id: str, operation: dict[str, Any], size: int) -> None:
        if self.size + size <= self.limit:  # past it, results() reads that one again: slower, never unbounded
            self._operations[result_id] = (operation, size)
            self.size += size

    def take(self, result_id: str) -> dict[str, Any] | None:
        operation, size = self._operations.pop(result_id, (None, 0))
        self.size -= size
        return operation


def _body(key: str, document: Any) -> Any:
    """The analyze request of one item: its bytes as they are, else an ``AnalyzeDocumentRequest`` object."""
    if isinstance(document, (bytes, bytearray)):
        return bytes(document)
    if isinstance(document, Mapping) and ("urlSource" in document or "base64Source" in document):
        return dict(document)
    raise ConfigurationError(f"AzureDocumentJobs: the request of {key!r} must be the document's bytes or "
                             f"{{'urlSource': ...}} / {{'base64Source': ...}}, got {type(document).__name__}")


def _operation_id(poller: Any, key: str) -> str:
    """The ``resultId`` the 202's ``Operation-Location`` names (as the SDK's poller parses it), checked."""
    try:
        found = poller.details["operation_id"]
    except (AttributeError, KeyError, TypeError) as exc:
        raise ResultUnreadable(f"azure submission of {key!r}: the answer named no Operation-Location") from exc
    return _checked_id(found, key)


def _checked_id(found: Any, key: str) -> str:
    if not isinstance(found, str) or not _RESULT_ID.fullmatch(found):
        raise ResultUnreadable(f"azure submission of {key!r}: the Operation-Location names {str(found)[:80]!r}, "
                               "not a result id")
    return found


def _status(where: str, answer: Mapping[str, Any]) -> str:
    state = answer.get("status")
    if state not in _RUNNING | _FINISHED:
        raise ResultUnreadable(f"{where}: status is {str(state)[:40]!r}, not one of Azure's")
    return str(state)


def _text(where: str, name: str, value: Any) -> str:
    if value is not None and not isinstance(value, str):
        raise ResultUnreadable(f"{where}: {name} is {type(value).__name__}, not a string")
    return value or ""


def _list(where: str, name: str, value: Any) -> list[Any]:
    if value is not None and not isinstance(value, list):
        raise ResultUnreadable(f"{where}: {name} is {type(value).__name__}, not a list")
    return value or []


def _field(where: str, what: str, value: Any, name: str) -> Any:
    if not isinstance(value, dict):
        raise ResultUnreadable(f"{where}: {what} is {type(value).__name__}, not an object")
    return value.get(name)


def _group(job_id: str) -> tuple[str, dict[str, str], str | None]:
    """The group's model, each item's resultId, and the token whose first submission may have been lost."""
    group = json.loads(job_id)
    return str(group["model"]), {str(k): str(v) for k, v in group["results"].items()}, group.get("unfound")
