"""What a provider's asynchronous job API looks like to :func:`run_provider_job` (an LLM batch, an async OCR
job): submit under an idempotency token, find by that token, poll, and read the results per item."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from recovery_ext._store.statuses import JobStatus

RUNNING, COMPLETED, EXPIRED, CANCELLED, FAILED = (JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.EXPIRED,
                                                  JobStatus.CANCELLED, JobStatus.FAILED)


@dataclass(frozen=True)
class JobResult:
    """One item's result in a finished job: its answer, or the error category that left it unfinished.
    ``cost``: what the provider charges for it when the adapter knows (e.g. per page), else the ``prices``
    given to :func:`run_provider_job` price its tokens. ``note``: why the token figures are not what the
    provider said (its usage was unreadable and is recorded as 0, as :func:`read_usage` says); the item is
    kept and its cost is unknown."""

    answer: Any = None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    model: str | None = None
    cost: float | None = None
    note: str | None = None


class JobAdapter(Protocol):
    """A provider's asynchronous job API. ``status`` says one of running, completed, expired, cancelled, failed;
    ``results`` holds what the job finished (also for an expired or cancelled one), by item key. An adapter whose
    ``submit`` under a token already used answers the provider's existing job instead of starting one (and whose
    ``find`` therefore finds nothing) says so with a class attribute ``submit_reattaches = True``."""

    provider: str   # a short name, the key of its jobs in the store (e.g. "openai-batch")
    endpoint: str   # where it is sent (redacted in the ledger)

    def submit(self, requests: Mapping[str, Any], token: str) -> str: ...

    def find(self, token: str) -> str | None: ...

    def status(self, job_id: str) -> str: ...

    def results(self, job_id: str) -> Mapping[str, JobResult]: ...
