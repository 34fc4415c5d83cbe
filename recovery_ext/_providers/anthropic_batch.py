"""Anthropic's Message Batches API as a provider job (see :func:`run_provider_job`): half the price, results
within 24 h.

A job is one message batch whose requests are the items' Messages API parameters. The API takes no
idempotency key and keeps no metadata on a batch, so the job's intent (its token and its requests) is
recorded before the submission, and each request's ``custom_id`` carries both: the token's first 20
characters, then a SHA-256 of the item's key and its request. After a crash between the submission and
the id's checkpoint, :meth:`AnthropicBatchJobs.find` lists the recent batches (newest first, within
:class:`ReadLimits`), keeps those created around the intent with at least as many requests, and matches their
requests to it: an ended batch by its results' ``custom_id``s; a batch still in progress cannot show its
requests yet, so every such candidate is re-attached as one job and only results whose ``custom_id`` is
one of the intent's are ever kept or ledgered (another pipeline's batch costs a wait, never an answer).

Results are read line by line from the batch's ``results_url``: ``succeeded`` is the answer (the
message, with its usage), ``errored``, ``canceled`` and ``expired`` are item errors with the service's
words, a line that does not parse costs its own item only, and a batch the service no longer knows (404)
is expired with every item ``job_gone``. The ``anthropic`` SDK (the ``anthropic`` extra) does the wire
work; the library never imports it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from recovery_ext._classify.classifier import ClassifiedError
from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError
from recovery_ext._providers.journal import fingerprint
from recovery_ext._providers.jobs import (CANCELLED, COMPLETED, EXPIRED, FAILED, JOB_GONE, RUNNING, UNREADABLE_RESULT,
                                          Intents, JobResult, JobResults, ReadBudget, ReadLimits, ResultUnbounded,
                                          is_gone, json_line, lines_within, note)
from recovery_ext._providers.usage import read_usage

_STATES = {"in_progress": RUNNING, "canceling": RUNNING, "ended": COMPLETED}
# The service's words for a request's fate, in its request_counts and results (not this library's statuses).
_ENDED_AS = {"expired": EXPIRED, "canceled": CANCELLED}
_REQUEST_COUNTS = {"processing": RUNNING, "succeeded": COMPLETED, "errored": FAILED, **_ENDED_AS}
_PREFIX = 20  # characters of the job's token at the head of each custom_id


def custom_id(token: str, key: str, request: Any) -> str:
    """A request's ``custom_id`` (``^[a-zA-Z0-9_-]{1,64}$``): the job's token, then a fingerprint of the item's
    key and its request; the same for the same job, item and request, and nothing else."""
    digest = hashlib.sha256(f"{key}\0{fingerprint(request) or repr(request)}".encode()).hexdigest()[:40]
    return f"{_prefix(token)}-{digest}"


def _prefix(token: str) -> str:
    return "".join(c for c in token if c.isalnum())[:_PREFIX] or "rx"


class AnthropicBatchJobs:
    """Messages API requests (each the parameters ``client.messages.create`` takes: ``model``, ``max_tokens``,
    ``messages``, ...) as one message batch per job, through ``client`` (an ``anthropic.Anthropic``).
    ``limits`` bound each read of a batch's results and of the batch listing; a batch created more than
    ``skew_seconds`` before the intent or ``window_seconds`` after it is not the intent's."""

    provider = "anthropic-batch"

    def __init__(self, client: Any, *, limits: ReadLimits | None = None, find_pages: int = 5,
                 window_seconds: float = 3600.0, skew_seconds: float = 300.0) -> None:
        self.client = client
        self.limits = limits or ReadLimits()
        self.find_pages, self.window, self.skew = find_pages, window_seconds, skew_seconds
        self.endpoint = redact_url(f"{str(client.base_url).rstrip('/')}/v1/messages/batches")
        self._intents = Intents(custom_id)
        self._gone: dict[str, str] = {}           # batch id -> what the service said when it no longer knew it

    @classmethod
    def connect(cls, *, api_key: str | None = None, base_url: str | None = None, **options: Any) -> AnthropicBatchJobs:
        """A client through the ``anthropic`` SDK (the ``anthropic`` extra); the key from ``ANTHROPIC_API_KEY``
        unless given."""
        try:
            import anthropic
        except ImportError as exc:
            raise ConfigurationError("AnthropicBatchJobs.connect needs the anthropic SDK: "
                                     "pip install 'recovery-ext[anthropic]'") from exc
        return cls(anthropic.Anthropic(api_key=api_key, base_url=base_url), **options)

    # -- the JobAdapter protocol --------------------------------------------------------------------

    def expect(self, token: str, requests: Mapping[str, Any], since: dt.datetime | None = None) -> None:
        """The job's intent: its token and its requests (recorded before it was submitted, at ``since``)."""
        self._intents.expect(token, requests, since)

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        self.expect(token, requests)
        batch = self.client.messages.batches.create(requests=[
            {"custom_id": custom_id(token, key, request), "params": request} for key, request in requests.items()])
        return str(batch.id)

    def find(self, token: str) -> str | None:
        """The batch submitted for the intent under ``token``: an ended one whose results carry its custom_ids;
        else every batch still in progress that could be it (at least as many requests as this call knows of
        the intent, created around it), joined by ``+``; None when none could be (it was never created: submit
        it)."""
        ids, since = self._intents.of.get(token, (set(), None))
        if not ids:
            return None
        candidates: list[str] = []
        budget = ReadLimits(pages=self.find_pages, bytes=self.limits.bytes,
                            seconds=self.limits.seconds).reading("anthropic batch listing")
        try:
            for batch in self._recent(budget):
                created = _time(batch, "created_at")
                if since is not None and created is not None:
                    if created < since - dt.timedelta(seconds=self.skew):
                        break  # newest first: the rest are older than the intent
                    if created > since + dt.timedelta(seconds=self.window):
                        continue
                if _total(batch) < len(ids):  # fewer requests than this call knows of the intent: not it
                    continue
                if str(getattr(batch, "processing_status", "")) != "ended":
                    candidates.append(str(batch.id))
                elif self._holds(str(batch.id), token):
                    return str(batch.id)
        except ResultUnbounded:  # looked as far back as the limits go
            pass
        return "+".join(candidates) or None

    def status(self, job_id: str) -> str:
        states = []
        for batch_id in job_id.split("+"):
            batch = self._retrieve(batch_id)
            if batch is None:
                states.append(EXPIRED)
                continue
            state = _STATES.get(str(getattr(batch, "processing_status", None)))
            if state is None:
                raise ClassifiedError(category="provider_job", retryable=False, endpoint=self.endpoint,
                                      message=f"anthropic batch {batch_id} says processing_status "
                                              f"{getattr(batch, 'processing_status', None)!r}, which is none of "
                                              f"{sorted(_STATES)}")
            counts = getattr(batch, "request_counts", None)
            if state == COMPLETED:  # an ended batch that left requests expired or canceled ended that way
                state = next((ended for name, ended in _ENDED_AS.items() if _count(counts, name)), COMPLETED)
            states.append(state)
        if RUNNING in states:
            return RUNNING
        return next((s for s in (EXPIRED, CANCELLED) if s in states), COMPLETED)

    def results(self, job_id: str) -> JobResults:
        found = JobResults()
        batches = job_id.split("+")
        for batch_id in batches:
            where = f"anthropic batch {batch_id}"
            if self._retrieve(batch_id) is None:
                found.absent = JobResult(error=JOB_GONE, note=note(where, self._gone[batch_id]))
                continue
            try:
                for line in self._lines(batch_id, self.limits.reading(where)):
                    cid, result = _read_line(line, where)
                    key = self._intents.keys.get(cid) if cid is not None else None
                    if (cid is not None and key is None) or (cid is None and len(batches) > 1):
                        # another job's request (another candidate batch, or this job's other items); a line
                        # naming nothing is only this job's stray when the job is one batch
                        continue
                    found.add(key, result, where)
            except ResultUnbounded as exc:  # what was read is kept; the rest of the items are redone
                found.absent = JobResult(error=exc.category, note=note(where, exc.message))
            except Exception as exc:
                if not is_gone(exc):
                    raise
                found.absent = JobResult(error=JOB_GONE, note=note(where, _said(exc)))
        return found

    # -- reading ------------------------------------------------------------------------------------

    def _recent(self, budget: ReadBudget) -> Iterator[Any]:
        page = self.client.messages.batches.list(limit=100)
        while True:
            budget.page(token=getattr(page, "last_id", None))
            yield from page.data
            if not page.has_next_page():
                return
            page = page.get_next_page()

    def _retrieve(self, batch_id: str) -> Any:
        if batch_id in self._gone:
            return None
        try:
            return self.client.messages.batches.retrieve(batch_id)
        except Exception as exc:
            if not is_gone(exc):
                raise
            self._gone[batch_id] = _said(exc)
            return None

    def _holds(self, batch_id: str, token: str) -> bool:
        """Whether an ended batch is the intent's: its first result's custom_id carries the token."""
        try:
            for line in self._lines(batch_id, self.limits.reading(f"anthropic batch {batch_id}")):
                cid, _ = _read_line(line, batch_id)
                if cid is not None:
                    return cid.startswith(_prefix(token) + "-")
        except ResultUnbounded:
            return False
        return False

    def _lines(self, batch_id: str, budget: ReadBudget) -> Iterator[str]:
        """The batch's result lines as they stream in, each counted against the budget."""
        decoder = self.client.messages.batches.results(batch_id)
        try:
            yield from lines_within(decoder.http_response.iter_lines(), budget)
        finally:
            decoder.close()


def _said(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


def _time(batch: Any, name: str) -> dt.datetime | None:
    value = getattr(batch, name, None)
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return None


def _count(counts: Any, name: str) -> int:
    value = getattr(counts, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _total(batch: Any) -> int:
    counts = getattr(batch, "request_counts", None)
    return sum(_count(counts, name) for name in _REQUEST_COUNTS)


def _read_line(text: str, where: str) -> tuple[str | None, JobResult]:
    """One result line as (its custom_id, its result); None when the line names none."""
    line = json_line(text, where)
    if isinstance(line, tuple):  # a cut-off line still names its item: that item is redone
        return line
    cid = line.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return None, JobResult(error=UNREADABLE_RESULT, note=note(where, f"a line with no custom_id: {text[:200]}"))
    result: dict[str, Any] = line["result"] if isinstance(line.get("result"), dict) else {}
    kind = result.get("type")
    if kind == "succeeded":
        message = result.get("message")
        if not isinstance(message, dict):
            return cid, JobResult(error=UNREADABLE_RESULT, note=note(where, f"no message for {cid}"))
        usage = read_usage(message.get("usage"), names=("input_tokens", "output_tokens"))
        model = message.get("model")
        return cid, JobResult(answer=message, tokens_in=usage.tokens_in, tokens_out=usage.tokens_out,
                              note=usage.note, model=model if isinstance(model, str) and model else None)
    if kind == "errored":
        error = result.get("error")
        inner = error.get("error") if isinstance(error, dict) else None
        detail = inner if isinstance(inner, dict) else (error if isinstance(error, dict) else {})
        code = str(detail.get("type") or "errored")[:64]
        return cid, JobResult(error=code, note=note(where, detail.get("message") or code))
    if kind in _ENDED_AS:  # canceled or expired: never run, never billed
        return cid, JobResult(error=f"batch_{kind}", note=note(where, f"the request was {kind}"))
    return cid, JobResult(error=UNREADABLE_RESULT, note=note(where, f"result type {str(kind)[:40]!r}"))
