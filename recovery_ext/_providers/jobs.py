"""What a provider's asynchronous job API looks like to :func:`run_provider_job` (an LLM batch, an async OCR
job): submit under an idempotency token, find by that token, poll, and read the results per item.

A finished job's results are already paid for, so an adapter reads them defensively: a line or page it
cannot read costs that item only (a :class:`JobResult` with an error and the provider's own words in its
``note``), never the rest; it reads within :class:`ReadLimits` (pages, bytes, time), and a provider that
no longer knows the job answers its items as gone, so they are submitted again."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from recovery_ext._classify.redaction import redact
from recovery_ext._errors import ConfigurationError, RecoveryError
from recovery_ext._store.statuses import JobStatus

RUNNING, COMPLETED, EXPIRED, CANCELLED, FAILED = (JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.EXPIRED,
                                                  JobStatus.CANCELLED, JobStatus.FAILED)

# The item error of a finished job's item its results hold nothing for (a line the provider never wrote, or
# one that named no item it could be given to); the adapter's ``JobResults.absent`` says more when it knows.
MISSING_RESULT = "missing_result"
UNREADABLE_RESULT = "unreadable_result"  # a result line or page that does not parse as the provider documents it
UNBOUNDED_RESULT = "unbounded_result"    # reading it went past ReadLimits (pages, bytes or time)
JOB_GONE = "job_gone"                    # the provider no longer knows the job (404, deleted, past retention)
UNFINDABLE = "unfindable_submission"     # a part whose acceptance a crash lost: it may have been paid twice


@dataclass(frozen=True)
class JobResult:
    """One item's result in a finished job: its answer, or the error category that left it unfinished.
    ``cost``: what the provider charges for it when the adapter knows (e.g. per page), else the ``prices``
    given to :func:`run_provider_job` price its tokens. ``note``: why the token figures are not what the
    provider said (its usage was unreadable and is recorded as 0, as :func:`read_usage` says), or, with an
    error, the provider's own words about it; the item is kept (with no error) and its cost is unknown."""

    answer: Any = None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    model: str | None = None
    cost: float | None = None
    note: str | None = None


class JobResults(dict[str, JobResult]):
    """A finished job's results by item key, and what could not be given to an item: ``strays`` are answers
    the provider returned for no item of the job (an unknown ``custom_id``, a second answer to one item, a
    line naming none), ledgered and never kept; ``absent`` is what an item of the job with no result here is
    recorded with (None: ``missing_result``)."""

    def __init__(self, found: Mapping[str, JobResult] | Iterable[tuple[str, JobResult]] = (), *,
                 strays: Iterable[JobResult] = (), absent: JobResult | None = None) -> None:
        super().__init__(found)
        self.strays = list(strays)
        self.absent = absent

    def add(self, key: str | None, result: JobResult, where: str) -> None:
        """One result line read: an item's result; one naming no item, or a second one for an item, is a stray
        (paid when it is an answer, so ledgered with its tokens, never kept)."""
        if key is None:
            self.strays.append(result)
        elif key in self:
            self.strays.append(JobResult(error="duplicate_result", tokens_in=result.tokens_in,
                                         tokens_out=result.tokens_out, model=result.model,
                                         note=note(where, f"a second result for {key!r}")))
        else:
            self[key] = result


def custom_id_in(text: str, field: str = "custom_id") -> str | None:
    """The item name (``custom_id``, or ``field``) a result line gives, read even from a line cut off after it
    (so that item, and only it, is redone); None when it gives none."""
    named = re.search(rf'"{re.escape(field)}"\s*:\s*"((?:[^"\\]|\\.){{1,200}})"', text)
    if named is None:
        return None
    try:
        found = json.loads(f'"{named.group(1)}"')
    except ValueError:
        return None
    return found if isinstance(found, str) and found else None


def json_line(text: str, where: str, field: str = "custom_id") -> dict[str, Any] | tuple[str | None, JobResult]:
    """A result line as its JSON object; a line that is not one as (the item it still names by ``field``, if it
    was cut off after it, and its error, quoting the line)."""
    try:
        line = json.loads(text)
    except ValueError:
        line = None
    if isinstance(line, dict):
        return line
    return custom_id_in(text, field), JobResult(error=UNREADABLE_RESULT, note=note(where, f"unreadable line: "
                                                                                        f"{text[:200]}"))


def note(job: str, text: object) -> str:
    """An item error's note: the job it comes from and what the provider said, redacted and short enough
    for the ledger."""
    return redact(f"{job}: {text}")[:500]


class ResultUnreadable(RecoveryError):
    """A provider job's results could not be read as the provider documents them."""

    category = UNREADABLE_RESULT


class ResultUnbounded(ResultUnreadable):
    """Reading a provider job's results went past its limits (pages, bytes or time)."""

    category = UNBOUNDED_RESULT


@dataclass(frozen=True)
class ReadLimits:
    """How much an adapter reads of one job's results (or one listing) before it stops: ``pages`` (result
    pages, files or listing pages), ``bytes`` (of the answers' text) and ``seconds`` (wall clock). A page
    token seen twice stops the read at once (an endpoint that repeats it would be read for ever)."""

    pages: int = 10_000
    bytes: int = 1 << 30
    seconds: float = 900.0

    def __post_init__(self) -> None:
        for name in ("pages", "bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"ReadLimits({name}=...) must be a whole number >= 1, got {value!r}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not self.seconds > 0:
            raise ConfigurationError(f"ReadLimits(seconds=...) must be a number > 0, got {self.seconds!r}")

    def reading(self, what: str) -> ReadBudget:
        return ReadBudget(self, what)


class ReadBudget:
    """One read under :class:`ReadLimits`: each page (with its size and its continuation token) is counted,
    and the read raises :class:`ResultUnbounded`, naming ``what`` it was reading, past a limit."""

    def __init__(self, limits: ReadLimits, what: str) -> None:
        self.limits, self.what = limits, what
        self.pages = self.bytes = 0
        self._tokens: set[str] = set()
        self._began = time.monotonic()

    def page(self, size: int = 0, token: Any = None) -> None:
        self.pages += 1
        self.bytes += max(int(size), 0)
        limits = self.limits
        if self.pages > limits.pages:
            raise ResultUnbounded(f"{self.what}: more than {limits.pages} pages of results")
        if self.bytes > limits.bytes:
            raise ResultUnbounded(f"{self.what}: more than {limits.bytes} bytes of results")
        if time.monotonic() - self._began > limits.seconds:
            raise ResultUnbounded(f"{self.what}: reading its results took more than {limits.seconds:g} s")
        if token is not None:
            if str(token) in self._tokens:
                raise ResultUnbounded(f"{self.what}: the provider repeated the page token {str(token)[:40]!r} "
                                      f"after {self.pages} pages")
            self._tokens.add(str(token))


def is_gone(exc: BaseException) -> bool:
    """The provider answered that it does not know the job (HTTP 404, or 410 gone), as the SDKs raise it."""
    for status in (getattr(exc, "status_code", None), getattr(exc, "code", None),
                   getattr(getattr(exc, "response", None), "status_code", None)):
        if isinstance(status, int) and not isinstance(status, bool):
            return status in (404, 410)
    return False


def service_error_code(exc: BaseException) -> str | None:
    """The service's error code of a botocore ``ClientError`` (read from its response, so botocore need not be
    imported here)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code")) if isinstance(error, dict) and error.get("Code") else None


def lines_within(lines: Iterable[bytes | str], budget: ReadBudget) -> Iterator[str]:
    """The non-empty lines of a result file as they stream in, each counted against ``budget`` (its bytes and
    the time; the file is one page)."""
    budget.page()
    for raw in lines:
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        budget.page(len(line) + 1)
        budget.pages -= 1  # a line is bytes and time, not a page
        if line.strip():
            yield line


def number_field(where: str, name: str, value: Any, default: float = 0.0) -> float:
    """A number a provider's result gives (``default`` when absent); anything else is :class:`ResultUnreadable`,
    naming ``where`` (the job) and the field."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ResultUnreadable(f"{where}: {name} is {str(value)[:40]!r}, not a number")
    return float(value)


def whole_field(where: str, name: str, value: Any, *, default: int = 0) -> int:
    number = number_field(where, name, value, default)
    if number < 0 or not number.is_integer():
        raise ResultUnreadable(f"{where}: {name} is {value!r}, not a whole number >= 0")
    return int(number)


class DocumentResults(Mapping[str, JobResult]):
    """A group of per-document jobs' results (Textract's, Azure's), each document ``read`` (all its pages) on
    first access and kept, so a caller that keeps each item as it reads it loses at most the document being
    read to a crash; a document still in progress (``read`` answers None) is absent. ``strays``: ledger rows
    the group's collection writes (as :class:`JobResults` says)."""

    def __init__(self, read: Callable[[str], JobResult | None], documents: Mapping[str, str],
                 strays: Iterable[JobResult] = ()) -> None:
        self._reader, self._documents = read, dict(documents)
        self._read: dict[str, JobResult | None] = {}
        self.strays = list(strays)

    def __getitem__(self, key: str) -> JobResult:
        if key not in self._read:
            if key not in self._documents:
                raise KeyError(key)
            self._read[key] = self._reader(self._documents[key])
        found = self._read[key]
        if found is None:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._documents if key in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Intents:
    """The requests of the jobs an adapter was given (submitted, or expected on a resume), by the name each
    request has at the provider (a ``custom_id``, a ``recordId``) made from the job's token and the item."""

    def __init__(self, name: Callable[[str, str, Any], str]) -> None:
        self.name = name
        self.keys: dict[str, str] = {}  # a request's name -> its item key
        self.of: dict[str, tuple[set[str], datetime | None]] = {}  # token -> its requests' names, when recorded

    def expect(self, token: str, requests: Mapping[str, Any], since: datetime | None = None) -> None:
        names = {self.name(token, key, request): key for key, request in requests.items()}
        self.keys.update(names)
        self.of[token] = (set(names), since if since is not None else self.of.get(token, (set(), None))[1])


class JobAdapter(Protocol):
    """A provider's asynchronous job API. ``status`` says one of running, completed, expired, cancelled, failed
    (expired also for a job the provider no longer knows); ``results`` holds what the job finished (also for
    an expired or cancelled one), by item key, optionally as :class:`JobResults`. An adapter whose ``submit``
    under a token already used answers the provider's existing job instead of starting one (and whose
    ``find`` therefore finds nothing) says so with a class attribute ``submit_reattaches = True``. An adapter
    that needs a live job's intent to find it or read its results (its token, its requests and when the intent
    was recorded) has a method ``expect(token, requests, since)``, called before any other for that job.

    An adapter that submits a job one part at a time (one request per item) with no idempotency key has a
    method ``submit_by_parts(requests, token, accepted, progress)``, used instead of ``submit``: ``accepted``
    holds the parts (item -> the provider's id of its part) the provider accepted before a crash, which it
    re-uses instead of submitting again, and it calls ``progress(item, None)`` right before it sends an item
    and ``progress(item, part)`` once the provider accepted it. The jobs API records each call (fenced) before
    it returns, so a crash re-pays at most the one item whose submission was on its way, and the ledger names
    that item (``unfindable_submission``)."""

    provider: str   # a short name, the key of its jobs in the store (e.g. "openai-batch")
    endpoint: str   # where it is sent (redacted in the ledger)

    def submit(self, requests: Mapping[str, Any], token: str) -> str: ...

    def find(self, token: str) -> str | None: ...

    def status(self, job_id: str) -> str: ...

    def results(self, job_id: str) -> Mapping[str, JobResult]: ...
