"""OpenAI's Batch API as a provider job (see :func:`run_provider_job`): half the price, results within 24 h.

A job is one JSONL file of requests (``custom_id`` = the item key) uploaded with purpose ``batch`` and one
batch over it, created with the job's idempotency token in its ``metadata`` so a resume whose crash came
before the batch id was recorded finds it by the token instead of creating another. Results come from
the batch's output file (answers, with usage) and error file (e.g. ``batch_expired``), also for an
expired or cancelled batch. The ``openai`` SDK does the wire work; its own retries stay on for these few
idempotent reads and the upload.

Every answer in the output file is paid for, so it is read one line at a time: a line that does not parse
costs its own item only (``unreadable_result``, with the line's start as the provider's words; a line
naming no item is ledgered as a stray and its item, absent, is redone), a second answer to one item and an
answer to an item the job does not hold are ledgered as strays (``duplicate_result``, ``unknown_item``).
A batch the provider answers 404 for (deleted, or past retention) is ``expired`` with every item
``job_gone``, so its items are submitted again. The files and the batch listing are read within
:class:`ReadLimits`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from recovery_ext._classify.classifier import ClassifiedError
from recovery_ext._classify.redaction import redact_url
from recovery_ext._providers.jobs import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    FAILED,
    JOB_GONE,
    RUNNING,
    UNREADABLE_RESULT,
    JobResult,
    JobResults,
    ReadBudget,
    ReadLimits,
    ResultUnbounded,
    json_line,
    is_gone,
    lines_within,
    note,
)
from recovery_ext._providers.usage import read_usage

TOKEN_KEY = "recovery_token"
_STATES = {"validating": RUNNING, "in_progress": RUNNING, "finalizing": RUNNING, "completed": COMPLETED,
           "expired": EXPIRED, "cancelling": RUNNING, "cancelled": CANCELLED, "failed": FAILED}


class OpenAIBatchJobs:
    """Chat-completion requests (each a request body, as ``client.chat.completions.create`` takes it) as one
    batch per job, through ``client`` (an ``openai.OpenAI``). ``limits`` bound each read of a batch's files
    and of the batch listing (pages, bytes, time)."""

    provider = "openai-batch"

    def __init__(self, client: Any, *, url: str = "/v1/chat/completions", completion_window: str = "24h",
                 limits: ReadLimits | None = None, find_pages: int = 10) -> None:
        self.client, self.url, self.completion_window = client, url, completion_window
        self.limits = limits or ReadLimits()
        self.find_pages = find_pages  # the most recent find_pages * 100 batches are looked through by token
        self.endpoint = redact_url(f"{str(client.base_url).rstrip('/')}/batches")
        self._gone: dict[str, str] = {}  # batch id -> what the provider said when it no longer knew it

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        lines = "\n".join(json.dumps({"custom_id": key, "method": "POST", "url": self.url, "body": body})
                          for key, body in requests.items())
        uploaded = self.client.files.create(file=("requests.jsonl", lines.encode()), purpose="batch")
        batch = self.client.batches.create(input_file_id=uploaded.id, endpoint=self.url,
                                           completion_window=self.completion_window, metadata={TOKEN_KEY: token})
        return str(batch.id)

    def find(self, token: str) -> str | None:
        budget = ReadLimits(pages=self.find_pages, bytes=self.limits.bytes,
                            seconds=self.limits.seconds).reading("openai batch listing")
        page = self.client.batches.list(limit=100)
        try:
            while True:
                last = page.data[-1] if page.data else None
                budget.page(token=getattr(last, "id", None))  # the next page's cursor: a repeat ends the look
                for batch in page.data:
                    if (getattr(batch, "metadata", None) or {}).get(TOKEN_KEY) == token:
                        return str(batch.id)
                if not page.has_next_page():
                    return None
                page = page.get_next_page()
        except ResultUnbounded:  # looked through as far as the limits go: not found among the recent batches
            return None

    def _retrieve(self, job_id: str) -> Any:
        """The batch, or None once the provider answered that it no longer knows it (kept: not asked again)."""
        if job_id in self._gone:
            return None
        try:
            return self.client.batches.retrieve(job_id)
        except Exception as exc:
            if not is_gone(exc):
                raise
            self._gone[job_id] = _said(exc)
            return None

    def status(self, job_id: str) -> str:
        batch = self._retrieve(job_id)
        if batch is None:
            return EXPIRED
        state = _STATES.get(str(getattr(batch, "status", None)))
        if state is None:
            raise ClassifiedError(category="provider_job", retryable=False, endpoint=self.endpoint,
                                  message=f"openai batch {job_id} says status {getattr(batch, 'status', None)!r}, "
                                          f"which is none of {sorted(_STATES)}")
        return state

    def results(self, job_id: str) -> JobResults:
        batch = self._retrieve(job_id)
        if batch is None:
            return JobResults(absent=JobResult(error=JOB_GONE, note=note(f"openai batch {job_id}",
                                                                         self._gone[job_id])))
        found = JobResults(absent=_failed(batch, job_id))
        budget = self.limits.reading(f"openai batch {job_id}")
        answers: dict[str, JobResult] = {}
        errors: dict[str, JobResult] = {}
        for file_id, into in ((batch.output_file_id, answers), (batch.error_file_id, errors)):
            if not file_id:
                continue
            where = f"openai batch {job_id} file {file_id}"
            try:
                for line in self._lines(file_id, budget):
                    key, result = _read_line(line, where)
                    if key is None:
                        found.strays.append(result)
                    elif key in answers or (into is errors and key in errors):
                        found.strays.append(_duplicate(result, key, where))
                    else:
                        into[key] = result
            except ResultUnbounded as exc:  # what was read is kept; the rest of the items are redone
                found.absent = JobResult(error=exc.category, note=note(where, exc.message))
                break
            except Exception as exc:
                if not is_gone(exc):
                    raise
                found.absent = JobResult(error=JOB_GONE, note=note(where, _said(exc)))
        found.update(errors)
        found.update(answers)  # an answer wins over an error
        return found

    def _lines(self, file_id: str, budget: ReadBudget) -> Iterator[str]:
        """The file's lines, read as they stream in; each counted against the budget (bytes and time)."""
        with self.client.files.with_streaming_response.content(file_id) as response:
            yield from lines_within(response.iter_lines(), budget)


def _failed(batch: Any, job_id: str) -> JobResult | None:
    """What each item of a batch that failed as a whole (e.g. its input did not validate) is recorded with: the
    batch's own errors."""
    if _STATES.get(str(getattr(batch, "status", ""))) != FAILED:
        return None
    errors = getattr(getattr(batch, "errors", None), "data", None) or []
    said = "; ".join(f"{getattr(e, 'code', None)}: {getattr(e, 'message', None)}" for e in errors[:3])
    return JobResult(error="batch_failed", note=note(f"openai batch {job_id}", said or "the batch failed"))


def _said(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


def _duplicate(result: JobResult, key: str, where: str) -> JobResult:
    """A second line for one item: paid for when it is an answer, so ledgered, never kept."""
    return JobResult(error="duplicate_result", tokens_in=result.tokens_in, tokens_out=result.tokens_out,
                     model=result.model, note=note(where, f"a second line for custom_id {key!r}"))


def _read_line(text: str, where: str) -> tuple[str | None, JobResult]:
    """One line of a batch's output or error file as (its item, its result); an item None when the line names
    none (the result then says why)."""
    line = json_line(text, where)
    if isinstance(line, tuple):  # a cut-off line still names its item: that item is redone
        return line
    key = line.get("custom_id")
    if not isinstance(key, str) or not key:
        return None, JobResult(error=UNREADABLE_RESULT, note=note(where, f"a line with no custom_id: {text[:200]}"))
    response = line.get("response")
    error = line.get("error")
    if error is not None and not isinstance(error, dict):
        error = {"code": "provider_error", "message": str(error)}
    if not isinstance(response, dict):
        response = {}
    status = response.get("status_code")
    if error or status != 200:
        code = (error or {}).get("code") or f"http_{status}"
        said = (error or {}).get("message") or _error_message(response.get("body"))
        return key, JobResult(error=str(code)[:64], note=note(where, said) if said else None)
    body = response.get("body")
    if not isinstance(body, dict):
        return key, JobResult(error=UNREADABLE_RESULT, note=note(where, f"an answer with no body: {text[:200]}"))
    # The answer is paid for: a usage it cannot read is recorded as 0 tokens with a note, never an error.
    usage = read_usage(body.get("usage"))
    model = body.get("model")
    return key, JobResult(answer=body, tokens_in=usage.tokens_in, tokens_out=usage.tokens_out, note=usage.note,
                          model=model if isinstance(model, str) and model else None)


def _error_message(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else None

