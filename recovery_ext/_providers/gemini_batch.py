"""The Gemini API's batch mode as a provider job (see :func:`run_provider_job`): half the price, results within
24 h.

A job is one uploaded JSONL file of requests (each line a ``key``, the item's key, and its
``GenerateContentRequest``) and one batch over it, created with ``rx-{token}`` as its display name: a
resume whose crash came before the batch's name was recorded lists the recent batches (newest first,
within :class:`ReadLimits`) and finds it by that name instead of creating another. Results come from the
batch's responses file, read line by line within the limits (its size is asked first, so a file past
``limits.bytes`` is never downloaded): ``response`` is the answer (its ``usageMetadata`` the tokens),
``error`` an item error (``gemini_{status}``, with its message), a line that does not parse costs its own
item, and a batch the API no longer knows (404) is ``expired`` with every item ``job_gone``. The
``google-genai`` SDK (the ``gemini`` extra) does the wire work; the library imports it only in
:meth:`GeminiBatchJobs.connect`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from typing import Any

from recovery_ext._classify.classifier import ClassifiedError
from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError
from recovery_ext._providers.jobs import (CANCELLED, COMPLETED, EXPIRED, FAILED, JOB_GONE, MISSING_RESULT, RUNNING,
                                          UNBOUNDED_RESULT, UNREADABLE_RESULT, JobResult, JobResults, ReadBudget,
                                          ReadLimits, ResultUnbounded, json_line, is_gone, lines_within, note)
from recovery_ext._providers.usage import read_usage

_STATES = {"JOB_STATE_PENDING": RUNNING, "JOB_STATE_QUEUED": RUNNING, "JOB_STATE_RUNNING": RUNNING,
           "JOB_STATE_CANCELLING": RUNNING, "JOB_STATE_UPDATING": RUNNING, "JOB_STATE_PAUSED": RUNNING,
           "JOB_STATE_SUCCEEDED": COMPLETED, "JOB_STATE_PARTIALLY_SUCCEEDED": COMPLETED,
           "JOB_STATE_FAILED": FAILED, "JOB_STATE_CANCELLED": CANCELLED, "JOB_STATE_EXPIRED": EXPIRED}


GOOGLE = "https://generativelanguage.googleapis.com"


def display_name(token: str) -> str:
    return f"rx-{token}"


class GeminiBatchJobs:
    """``generate_content`` requests (each a ``GenerateContentRequest`` as JSON: ``contents``,
    ``generationConfig``, ...) as one batch per job for ``model``, through ``client`` (a ``genai.Client`` of
    the Gemini Developer API). ``limits`` bound each read of a responses file and of the batch listing;
    ``base_url`` names the API in the ledger (the client's own, when it is not Google's)."""

    provider = "gemini-batch"

    def __init__(self, client: Any, *, model: str, limits: ReadLimits | None = None, find_pages: int = 10,
                 base_url: str = GOOGLE) -> None:
        self.client, self.model = client, model
        self.limits = limits or ReadLimits()
        self.find_pages = find_pages
        self.endpoint = redact_url(f"{base_url.rstrip('/')}/v1beta/batches")  # the ledger's name for it
        self._gone: dict[str, str] = {}

    @classmethod
    def connect(cls, *, model: str, api_key: str | None = None, base_url: str | None = None,
                **options: Any) -> GeminiBatchJobs:
        """A client through the ``google-genai`` SDK (the ``gemini`` extra); the key from ``GEMINI_API_KEY``
        (or ``GOOGLE_API_KEY``) unless given."""
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:
            raise ConfigurationError("GeminiBatchJobs.connect needs google-genai: "
                                     "pip install 'recovery-ext[gemini]'") from exc
        http = types.HttpOptions(base_url=base_url) if base_url else None
        return cls(genai.Client(api_key=api_key, http_options=http), model=model,
                   base_url=base_url or GOOGLE, **options)

    # -- the JobAdapter protocol --------------------------------------------------------------------

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        lines = "\n".join(json.dumps({"key": key, "request": request}) for key, request in requests.items())
        uploaded = self.client.files.upload(file=io.BytesIO(lines.encode() + b"\n"),
                                            config={"mime_type": "application/jsonl",
                                                    "display_name": display_name(token)})
        batch = self.client.batches.create(model=self.model, src=uploaded.name,
                                           config={"display_name": display_name(token)})
        return str(batch.name)

    def find(self, token: str) -> str | None:
        budget = ReadLimits(pages=self.find_pages, bytes=self.limits.bytes,
                            seconds=self.limits.seconds).reading("gemini batch listing")
        try:
            for batch in self._recent(budget):
                if getattr(batch, "display_name", None) == display_name(token):
                    return str(batch.name)
        except ResultUnbounded:  # looked as far back as the limits go
            pass
        return None

    def status(self, job_id: str) -> str:
        batch = self._batch(job_id)
        if batch is None:
            return EXPIRED
        state = _STATES.get(_state(batch))
        if state is None:
            raise ClassifiedError(category="provider_job", retryable=False, endpoint=self.endpoint,
                                  message=f"gemini batch {job_id} says state {_state(batch)!r}, which is none of "
                                          f"{sorted(_STATES)}")
        return state

    def results(self, job_id: str) -> JobResults:
        where = f"gemini batch {job_id}"
        batch = self._batch(job_id)
        if batch is None:
            return JobResults(absent=JobResult(error=JOB_GONE, note=note(where, self._gone[job_id])))
        name = getattr(getattr(batch, "dest", None), "file_name", None)
        if not name:
            said = getattr(getattr(batch, "error", None), "message", None) or f"no responses file ({_state(batch)})"
            return JobResults(absent=JobResult(error=MISSING_RESULT, note=note(where, said)))
        size = _whole(getattr(self.client.files.get(name=name), "size_bytes", None))
        if size > self.limits.bytes:
            return JobResults(absent=JobResult(error=UNBOUNDED_RESULT, note=note(
                where, f"its responses file {name} has {size} bytes, more than {self.limits.bytes}")))
        found = JobResults()
        try:
            data = self.client.files.download(file=name)
            for line in lines_within(io.BytesIO(data), self.limits.reading(where)):
                found.add(*_read_line(line, where), where)
        except ResultUnbounded as exc:  # what was read is kept; the rest of the items are redone
            found.absent = JobResult(error=exc.category, note=note(where, exc.message))
        return found

    # -- reading ------------------------------------------------------------------------------------

    def _recent(self, budget: ReadBudget) -> Iterator[Any]:
        pager = self.client.batches.list(config={"page_size": 100})
        while True:
            budget.page(token=(getattr(pager, "config", None) or {}).get("page_token"))
            yield from pager.page
            try:
                pager.next_page()
            except IndexError:  # no more pages
                return

    def _batch(self, job_id: str) -> Any:
        if job_id in self._gone:
            return None
        try:
            return self.client.batches.get(name=job_id)
        except Exception as exc:
            if not is_gone(exc):
                raise
            self._gone[job_id] = str(getattr(exc, "message", None) or exc)
            return None


def _state(batch: Any) -> str:
    state = getattr(batch, "state", None)
    return str(getattr(state, "value", state))


def _whole(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def _read_line(text: str, where: str) -> tuple[str | None, JobResult]:
    line = json_line(text, where, "key")
    if isinstance(line, tuple):  # a cut-off line still names its item: that item is redone
        return line
    key = line.get("key")
    if not isinstance(key, str) or not key:
        return None, JobResult(error=UNREADABLE_RESULT, note=note(where, f"a line with no key: {text[:200]}"))
    error = line.get("error")
    if error is not None:
        detail = error if isinstance(error, dict) else {"message": str(error)}
        code = f"gemini_{str(detail.get('status') or detail.get('code') or 'error').lower()}"[:64]
        return key, JobResult(error=code, note=note(where, detail.get("message") or code))
    response = line.get("response")
    if not isinstance(response, dict):
        return key, JobResult(error=UNREADABLE_RESULT, note=note(where, f"no response for key {key!r}"))
    usage = read_usage(response.get("usageMetadata"), names=("promptTokenCount", "candidatesTokenCount"))
    model = response.get("modelVersion")
    return key, JobResult(answer=response, tokens_in=usage.tokens_in, tokens_out=usage.tokens_out, note=usage.note,
                          model=model if isinstance(model, str) and model else None)
