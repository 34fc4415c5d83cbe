"""Plain values the store returns. Rows become these so callers never hold a live cursor."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .fenced import FencedTransaction


def _from_mapping(cls, mapping) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in dict(mapping).items() if k in names})


@dataclass(frozen=True)
class NodeSpec:
    """A node of a pipeline as declared by its job."""

    name: str
    optional: bool = False


@dataclass(frozen=True)
class Ownership:
    """What a worker holds while it owns a pipeline; every write it makes is fenced by it."""

    pipeline_id: int
    epoch: int
    owner: str


@dataclass(frozen=True)
class ItemCheckpoint:
    """One item of a checkpoint batch: its result, status and the side-effect writes ``also(tx)``."""

    key: str
    result: Any = None
    status: str = "completed"
    also: Callable[[FencedTransaction], None] | None = None


@dataclass(frozen=True)
class Pipeline:
    id: int
    job_name: str
    status: str
    params: Any
    owner: str | None
    epoch: int
    resume_count: int
    max_resumes: int
    origin_run_id: str | None = None
    resumed_from: str | None = None
    current_node: str | None = None
    heartbeat_at: dt.datetime | None = None
    heartbeat_deadline: dt.datetime | None = None
    deadline: dt.datetime | None = None
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    error: str | None = None
    gave_up_reason: str | None = None
    waiting_until: dt.datetime | None = None
    waiting_since: dt.datetime | None = None
    waiting_reason: str | None = None
    launcher: str | None = None

    from_row = classmethod(_from_mapping)

    @property
    def shown_status(self) -> str:
        """``waiting`` while a provider outage pauses the (still live) pipeline, else its status."""
        return "waiting" if self.status == "running" and self.waiting_until is not None else self.status


@dataclass(frozen=True)
class Node:
    id: int
    pipeline_id: int
    name: str
    position: int
    status: str
    optional: bool
    attempts: int
    items_total: int | None = None
    error: str | None = None
    error_category: str | None = None
    error_status_code: int | None = None
    run_id: str | None = None
    started_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    heartbeat_deadline: dt.datetime | None = None
    stall_deadline: dt.datetime | None = None
    output: Any = None

    from_row = classmethod(_from_mapping)

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "degraded", "skipped")


@dataclass(frozen=True)
class QueueItem:
    id: int
    queue: str
    status: str
    payload: Any
    attempts: int
    max_attempts: int
    worker: str | None = None
    dedupe_key: str | None = None
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    heartbeat_deadline: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    result: Any = None
    last_error: str | None = None
    last_error_at: dt.datetime | None = None
    available_at: dt.datetime | None = None
    holder_pipeline_id: int | None = None
    holder_epoch: int | None = None

    from_row = classmethod(_from_mapping)


@dataclass(frozen=True)
class Orphan:
    id: int
    job_name: str
    owner: str | None
    epoch: int
    resume_count: int
    max_resumes: int
    reason: str
    heartbeat_deadline: dt.datetime | None = None
    deadline: dt.datetime | None = None


@dataclass(frozen=True)
class Reclaimed:
    """A pipeline taken over by a new owner; its running nodes are pending again."""

    pipeline_id: int
    job_name: str
    params: Any
    previous_owner: str | None
    owner: str | None
    epoch: int
    resume_number: int
    reset_nodes: tuple[str, ...] = ()
    origin_run_id: str | None = None
    launcher: str | None = None
    owner_heartbeating: bool = False   # the previous owner's run heartbeat was still live at the reclaim


@dataclass(frozen=True)
class GivenUp:
    pipeline_id: int
    job_name: str
    previous_owner: str | None
    reason: str


@dataclass(frozen=True)
class ErrorInfo:
    """What the store records about a node's error (already redacted)."""

    message: str
    category: str | None = None
    status_code: int | None = None


@dataclass
class ScanStats:
    """The result of one recovery scan (seed 001's recovery metrics)."""

    found: int = 0
    reclaimed: int = 0
    given_up: int = 0
    corrupt: int = 0
    failed: int = 0
    duration_ms: float = 0.0
    error: str | None = None
    reclaimed_pipelines: list[Reclaimed] = field(default_factory=list)
    given_up_pipelines: list[GivenUp] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "reclaimed": self.reclaimed,
            "given_up": self.given_up,
            "corrupt": self.corrupt,
            "failed": self.failed,
            "duration_ms": round(self.duration_ms, 2),
            "error": self.error,
        }
