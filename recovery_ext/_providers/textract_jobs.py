"""Amazon Textract's asynchronous text detection as a provider job (see :func:`run_provider_job`).

Textract runs one job per document (``StartDocumentTextDetection`` on an S3 object), so a provider job
here is a group of them: one per item, started under a ``ClientRequestToken`` made from the job's
idempotency token and the item's key. The group's id is the JSON of each item's Textract ``JobId``, written
to the store once every document has one. Textract answers a start repeated under the same token with the
same ``JobId`` and starts nothing: a resume whose crash came before the id was written submits again
under the same token and gets the jobs already running (``find`` has nothing to look up). Results come
from ``GetDocumentTextDetection``, page by page (``NextToken``), as the LINE blocks of each document.

A document whose job ``FAILED`` or ended ``PARTIAL_SUCCESS`` comes back as an item error, and so does one
whose ``JobId`` the service no longer knows (results are kept 7 days: ``InvalidJobIdException``); the
jobs API resubmits those items only. A document's answer is read within :class:`ReadLimits` (result pages,
bytes, time; a ``NextToken`` repeated ends the read) and every field read is checked: a page past a limit or
one that does not parse is that document's error (``unbounded_result``, ``unreadable_result``), with a
note naming its ``JobId``, and the document is redone. ``botocore`` is imported only by :meth:`TextractJobs.connect`
(the ``aws`` extra); an application that makes its own client passes it in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError
from recovery_ext._providers.jobs import (
    COMPLETED,
    EXPIRED,
    FAILED,
    RUNNING,
    DocumentResults,
    JobResult,
    ReadLimits,
    ResultUnreadable,
    note,
    number_field,
    service_error_code,
    whole_field,
)

MODEL = "textract-detect-document-text"
_FINISHED = {"SUCCEEDED", "FAILED", "PARTIAL_SUCCESS"}
_GONE = "GONE"  # the service no longer knows the JobId (expired results): not one of Textract's statuses
_ERRORS = {"FAILED": "textract_failed", "PARTIAL_SUCCESS": "textract_partial_success", _GONE: "job_expired"}


def document_token(token: str, key: str) -> str:
    """The ``ClientRequestToken`` of one item's document: at most 64 of ``[a-zA-Z0-9-_]``, the same for the
    same job token and item, different for a resubmission (a new job token)."""
    return f"{token[:32]}-{hashlib.sha256(key.encode()).hexdigest()[:24]}"


class TextractJobs:
    """Documents (each a Textract ``DocumentLocation``: ``{"S3Object": {"Bucket": ..., "Name": ...}}``) as
    one Textract text detection job each, grouped as one provider job, through ``client`` (a botocore or
    boto3 ``textract`` client). Each item's answer is ``{"text", "lines", "pages", "confidence", "job_id"}``
    (``confidence`` the mean of its lines', 0 to 1). ``price_per_page`` prices each document in the ledger."""

    provider = "textract"
    # A start under a ClientRequestToken already used answers the job Textract started for it and starts none:
    # a resume's submission under the recorded token is its re-attachment (Textract has no look-up by token).
    submit_reattaches = True

    def __init__(self, client: Any, *, max_results: int = 1000, price_per_page: float | None = None,
                 start_options: Mapping[str, Any] | None = None, limits: ReadLimits | None = None) -> None:
        if not 1 <= max_results <= 1000:
            raise ConfigurationError(f"TextractJobs(max_results=...) must be 1 to 1000, got {max_results!r}")
        self.client, self.max_results, self.price_per_page = client, max_results, price_per_page
        self.limits = limits or ReadLimits()  # per document: its result pages, their bytes, the time to read them
        self.start_options = dict(start_options or {})  # e.g. OutputConfig, KMSKeyId, NotificationChannel
        self.endpoint = redact_url(str(client.meta.endpoint_url))
        self._states: dict[str, str] = {}  # JobId -> a finished job's state: not asked again

    @classmethod
    def connect(cls, *, region_name: str, endpoint_url: str | None = None, **options: Any) -> TextractJobs:
        """A client through botocore (the ``aws`` extra) with its standard retry mode; credentials from
        botocore's own chain (environment, profile, instance role), never from here."""
        try:
            import botocore.session
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigurationError("TextractJobs.connect needs botocore: pip install 'recovery-ext[aws]'") from exc
        client = botocore.session.get_session().create_client(
            "textract", region_name=region_name, endpoint_url=endpoint_url or None,
            config=Config(retries={"mode": "standard"}))
        return cls(client, **options)

    # -- the JobAdapter protocol --------------------------------------------------------------------

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        ids: dict[str, str] = {}
        for key, location in requests.items():
            started = self.client.start_document_text_detection(
                DocumentLocation=location, ClientRequestToken=document_token(token, key), **self.start_options)
            ids[key] = started["JobId"]
        return json.dumps(ids, separators=(",", ":"))

    def find(self, token: str) -> str | None:
        """Nothing to look up: Textract lists no jobs by token. A submission under the same token is the
        look-up (the service answers each document's running ``JobId`` and starts nothing)."""
        return None

    def status(self, job_id: str) -> str:
        states = [self._state(document_job) for document_job in _jobs(job_id).values()]
        if "IN_PROGRESS" in states:
            return RUNNING
        if all(state == "SUCCEEDED" for state in states):
            return COMPLETED
        if all(state in ("SUCCEEDED", _GONE) for state in states):
            return EXPIRED
        return FAILED

    def results(self, job_id: str) -> Mapping[str, JobResult]:
        """Each document's answer, read from Textract when it is first asked for: a caller that keeps each
        item as it reads it loses at most the document being read to a crash, not every one read before."""
        return DocumentResults(self._document, _jobs(job_id))

    # -- one document's job -------------------------------------------------------------------------

    def _get(self, document_job: str, **page: Any) -> dict[str, Any] | None:
        """One page of the job's answer; None when the service no longer knows the job."""
        try:
            answer: dict[str, Any] = self.client.get_document_text_detection(JobId=document_job, **page)
            return answer
        except Exception as exc:
            if service_error_code(exc) == "InvalidJobIdException":
                return None
            raise

    def _state(self, document_job: str) -> str:
        if document_job in self._states:
            return self._states[document_job]
        answer = self._get(document_job, MaxResults=1)
        state = _GONE if answer is None else str(answer.get("JobStatus") or "IN_PROGRESS")
        if state in _FINISHED or state == _GONE:
            self._states[document_job] = state
        return state

    def _document(self, document_job: str) -> JobResult | None:
        where = f"textract job {document_job}"
        try:
            read = self._read(document_job, where)
        except ResultUnreadable as exc:
            return JobResult(error=exc.category, model=MODEL, note=note(where, exc.message.removeprefix(where + ": ")))
        if read is None or isinstance(read, JobResult):
            return read
        lines, pages = read
        confidence = sum(line["confidence"] for line in lines) / len(lines) if lines else 0.0
        answer_of_item = {"text": "\n".join(line["text"] for line in lines), "lines": lines, "pages": pages,
                          "confidence": confidence, "job_id": document_job}
        cost = pages * self.price_per_page if self.price_per_page is not None else None
        return JobResult(answer=answer_of_item, model=MODEL, cost=cost)

    def _read(self, document_job: str, where: str) -> tuple[list[dict[str, Any]], int] | JobResult | None:
        """The document's LINEs and pages, page by page within the limits; None while it is in progress, a
        JobResult with the error when its job did not succeed."""
        lines: list[dict[str, Any]] = []
        pages, next_token = 0, None
        budget = self.limits.reading(where)
        while True:
            page = {"MaxResults": self.max_results, **({"NextToken": next_token} if next_token else {})}
            answer = self._get(document_job, **page)
            if answer is None:
                return JobResult(error=_ERRORS[_GONE], model=MODEL)
            state = answer.get("JobStatus") or "IN_PROGRESS"
            if state == "IN_PROGRESS":
                return None
            if state != "SUCCEEDED":
                said = answer.get("StatusMessage")
                return JobResult(error=_ERRORS.get(str(state), f"textract_{str(state).lower()}"[:64]), model=MODEL,
                                 note=note(where, said) if said else None)
            next_token = answer.get("NextToken")
            budget.page(_size(answer), next_token)
            pages = whole_field(where, "DocumentMetadata.Pages", (answer.get("DocumentMetadata") or {}).get("Pages"),
                           default=pages)
            blocks = answer.get("Blocks") or []
            if not isinstance(blocks, list):
                raise ResultUnreadable(f"{where}: Blocks is {type(blocks).__name__}, not a list")
            lines.extend(_line(where, b) for b in blocks if isinstance(b, dict) and b.get("BlockType") == "LINE")
            if not next_token:
                return lines, pages


def _size(answer: Mapping[str, Any]) -> int:
    """The page's size on the wire, as botocore kept its Content-Length (0 when it did not)."""
    headers = (answer.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    length = str(headers.get("content-length") or "0")
    return int(length) if length.isdigit() else 0


def _line(where: str, block: Mapping[str, Any]) -> dict[str, Any]:
    text = block.get("Text")
    if text is not None and not isinstance(text, str):
        raise ResultUnreadable(f"{where}: a LINE's Text is {type(text).__name__}, not a string")
    confidence = number_field(where, "a LINE's Confidence", block.get("Confidence"))
    if not 0 <= confidence <= 100:
        raise ResultUnreadable(f"{where}: a LINE's Confidence is {confidence!r}, not 0 to 100")
    return {"text": text or "", "confidence": confidence / 100,
            "page": whole_field(where, "a LINE's Page", block.get("Page"), default=1)}


def _jobs(job_id: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in json.loads(job_id).items()}
