"""Plain values the store returns. Rows become these so callers never hold a live cursor.

Every type the store's interfaces (interfaces.py) name comes from here: these values, the values of the provider
calls and of the operator's calls (provider_values.py and admin_values.py, imported through this module only),
and the one handle the store gives out, :class:`FencedTransaction` (what user code writes through; valid only
inside its ``with`` block, opened by the store's pipelines).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Self, TypeVar, cast

from recovery_ext._errors import ConfigurationError, StoreError
from recovery_ext._settings import LONGEST
from recovery_ext._conventions import storable_json
from recovery_ext._store.statuses import FINISHED_NODE_STATUSES, WAITING, ItemStatus, PipelineStatus

# The values of the provider calls and of the operator's calls live in their own modules, and come through here:
# every value the store's interfaces name is imported from models.
from recovery_ext._store.admin_values import GAP_WINDOW as GAP_WINDOW
from recovery_ext._store.admin_values import EventCursor as EventCursor
from recovery_ext._store.admin_values import Migration as Migration
from recovery_ext._store.admin_values import PruneResult as PruneResult
from recovery_ext._store.provider_values import BreakerDecision as BreakerDecision
from recovery_ext._store.provider_values import COST_KEYS as COST_KEYS
from recovery_ext._store.provider_values import CALL_KEY_TEXT_CHARS as CALL_KEY_TEXT_CHARS
from recovery_ext._store.provider_values import CostFigures as CostFigures
from recovery_ext._store.provider_values import CostReport as CostReport
from recovery_ext._store.provider_values import JournalHit as JournalHit
from recovery_ext._store.provider_values import JournalWrite as JournalWrite
from recovery_ext._store.provider_values import MAX_TOKENS as MAX_TOKENS
from recovery_ext._store.provider_values import ProviderCall as ProviderCall
from recovery_ext._store.provider_values import ProviderJobRow as ProviderJobRow
from recovery_ext._store.provider_values import Reopened as Reopened
from recovery_ext._store.provider_values import UNSTORABLE_TEXT as UNSTORABLE_TEXT
from recovery_ext._store.provider_values import LIMIT_MAXIMUM as LIMIT_MAXIMUM
from recovery_ext._store.provider_values import CAP_MAX_COST as CAP_MAX_COST
from recovery_ext._store.provider_values import CAP_MAX_TOKENS as CAP_MAX_TOKENS
from recovery_ext._store.provider_values import BudgetGrant as BudgetGrant
from recovery_ext._store.provider_values import CapState as CapState
from recovery_ext._store.provider_values import ProviderLimits as ProviderLimits
from recovery_ext._store.provider_values import SpendCaps as SpendCaps
from recovery_ext._store.provider_values import SpendGrant as SpendGrant
from recovery_ext._store.provider_values import WaitKind as WaitKind
from recovery_ext._store.provider_values import check_cap as check_cap
from recovery_ext._store.provider_values import check_limits as check_limits
from recovery_ext._store.provider_values import deployment_scope as deployment_scope
from recovery_ext._store.provider_values import pipeline_scope as pipeline_scope
from recovery_ext._store.provider_values import wait_kind as wait_kind

if TYPE_CHECKING:
    from sqlalchemy import Connection


_D = TypeVar("_D")


def _from_mapping(cls: type[_D], mapping: Any) -> _D:
    names = {f.name for f in fields(cast(Any, cls))}  # each caller is a dataclass
    return cls(**{k: v for k, v in dict(mapping).items() if k in names})


@dataclass(frozen=True)
class NodeSpec:
    """A node of a pipeline as declared by its job."""

    name: str
    optional: bool = False


@dataclass(frozen=True)
class PipelineLimits:
    """How long a pipeline's owner may stay silent, how long the pipeline may run, how often it may resume.

    ``heartbeat_timeout``: seconds without a heartbeat before the owner counts as dead.
    ``deadline_seconds``: a hard deadline from creation (``None``: none). ``max_resumes``: resumes
    before a crashing pipeline is given up.
    """

    heartbeat_timeout: float = 90.0
    deadline_seconds: float | None = None
    max_resumes: int = 3

    def __post_init__(self) -> None:
        # checked here, not at the insert: a bad limit would otherwise be stored and only misbehave at recovery
        for name in ("heartbeat_timeout", "deadline_seconds"):
            value = getattr(self, name)
            if value is None and name == "deadline_seconds":
                continue
            # compared before converted: an int beyond any float is refused, not an OverflowError
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"PipelineLimits.{name} must be a finite number of seconds > 0, "
                                         f"got {value!r:.40}")
            if value > LONGEST:  # both databases must be able to store the time it leads to
                raise ConfigurationError(f"PipelineLimits.{name} must be at most {LONGEST:g} s (a century), "
                                         f"got {value!r:.40}")
        # the column is a 32-bit integer, and the recovery scan fails a row whose counter reaches its top as corrupt
        if isinstance(self.max_resumes, bool) or not isinstance(self.max_resumes, int) \
                or not 0 <= self.max_resumes < 2**31 - 1:
            raise ConfigurationError(f"PipelineLimits.max_resumes must be a whole number from 0 to {2**31 - 2}, "
                                     f"got {self.max_resumes!r}")


@dataclass(frozen=True)
class Ownership:
    """What a worker holds while it owns a pipeline; every write it makes is fenced by it."""

    pipeline_id: int
    epoch: int
    owner: str


class JsonText(str):
    """An item result already encoded as JSON text: the store writes it as it is, without encoding it again
    (a batched checkpoint encodes each result once, where the op completes the item)."""

    __slots__ = ()


def encode_json(value: Any) -> JsonText:
    """``value`` as compact JSON text in the form both databases store alike (NUL and lone surrogates as U+FFFD,
    NaN and the infinities as null: see :func:`storable_json`); ``TypeError`` or ``ValueError`` when it is not JSON."""
    return JsonText(storable_json(value))

class ItemCheckpoint(NamedTuple):
    """One item of a checkpoint batch: its result, status and the side-effect writes ``also(tx)``.

    A named tuple, not a frozen dataclass: ``ctx.items(batch=N)`` makes one per item, and a frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost about 0.4 µs more each, a tenth
    of the loop's own time per item."""

    key: str
    result: Any = None  # a JSON value, or its text as JsonText
    status: str = ItemStatus.COMPLETED
    # Called with the fenced transaction the checkpoint commits in (a FencedTransaction).
    also: Callable[[Any], None] | None = None
    # The provider calls whose answers this checkpoint keeps: written (or marked) reached_checkpoint
    # in the same transaction.
    calls: tuple[ProviderCall, ...] = ()


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
    deployment: str | None = None
    # read with the database clock (schema.waiting_shown): paused and still live; None when the read did not ask
    waiting_shown: bool | None = None

    def __post_init__(self) -> None:
        if self.waiting_shown is not None and not isinstance(self.waiting_shown, bool):  # SQLite's 0 or 1
            object.__setattr__(self, "waiting_shown", bool(self.waiting_shown))

    @classmethod
    def from_row(cls, mapping: Any) -> Self:
        return _from_mapping(cls, mapping)

    @property
    def shown_status(self) -> str:
        """``waiting`` while a provider outage pauses the (still live) pipeline, else its status: an orphan whose
        run ended or died mid-pause awaits its resume, not the next try its pause showed."""
        if self.waiting_shown is not None:
            return WAITING if self.waiting_shown else self.status
        return WAITING if self.status == PipelineStatus.RUNNING and self.waiting_until is not None else self.status


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
    process: str | None = None
    watcher: str | None = None
    vouched_until: dt.datetime | None = None
    died_at: dt.datetime | None = None

    @classmethod
    def from_row(cls, mapping: Any) -> Self:
        return _from_mapping(cls, mapping)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_NODE_STATUSES


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

    @classmethod
    def from_row(cls, mapping: Any) -> Self:
        return _from_mapping(cls, mapping)


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
    owner_heartbeating: bool = False   # the previous owner's run heartbeat was still pulsing at the reclaim
    cause: str | None = None           # owner_run_dead, heartbeat, node_died, node_heartbeat, stalled, deadline
    heartbeat_age_seconds: float | None = None   # how long the previous owner had been silent


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
    """The result of one recovery scan (recovery metrics)."""

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


@dataclass(frozen=True)
class Scope:
    """Which pipelines a recovery pass may touch, and who reserves what it reclaims.

    ``job_names``/``deployment`` ``None``: any. ``launcher`` is the sensor that re-requests the
    resume runs of the pipelines it reserved.
    """

    job_names: Sequence[str] | None = None  # kept as a tuple
    deployment: str | None = None
    launcher: str | None = None
    # None: any pipeline. Else only these (and pipelines with no first run): the ones whose first run this
    # scope's orchestrator was seen to hold; the others are another instance's, never reclaimed, given up
    # or claimed here
    acting_on: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.job_names is not None:
            object.__setattr__(self, "job_names", _names("Scope.job_names", self.job_names))
        if self.acting_on is not None:
            object.__setattr__(self, "acting_on", _names("Scope.acting_on", self.acting_on))


def _names(what: str, values: Any) -> tuple[Any, ...]:
    """``values`` as a tuple; a lone string is refused (as a sequence it would be its characters)."""
    if isinstance(values, (str, bytes)):
        raise ConfigurationError(f"{what} must be a sequence, not the single string {values!r}")
    return tuple(values)


LEGACY_DEPLOYMENT = "default"  # the deployment of rows written before deployments existed
# The deployment of a run in a process of its own with no Dagster instance to name it (no DAGSTER_HOME):
# no orphan sensor runs in it, so nothing resumes its pipelines; `recovery-ext status` says so.
IN_PROCESS_DEPLOYMENT = "in-process"


@dataclass(frozen=True)
class ForeignOrphan:
    """An orphan of another deployment, in this sensor's jobs."""

    pipeline_id: int
    deployment: str
    origin_run_id: str
    stale: bool   # orphaned longer than the launch grace: its own deployment's sensor is not reclaiming it


@dataclass(frozen=True)
class FirstRun:
    """A live pipeline of this deployment and its first run, which the tick's instance must hold to act on it."""

    pipeline_id: int
    origin_run_id: str
    actionable: bool  # an orphan by the database clock, or reserved for a resume run: a tick would act on it


@dataclass(frozen=True)
class TickSnapshot:
    """One read of what an orphan-sensor tick must ask the orchestrator about.

    ``due``: some pipeline in scope is an orphan by the database clock alone (expired heartbeat,
    stalled node, passed deadline, corrupt row) or awaits a launcher; without it, and without dead
    owners, a tick has nothing to write.
    """

    run_owners: list[str]
    placeholders: list[str]
    stale_placeholders: list[str]   # reservations past half their launch grace (extended when their run waits)
    awaiting: list[Reclaimed]       # reserved for this scope's launcher, resume run not attached yet
    waiting: list[dict[str, Any]]   # pipelines pausing on a provider outage
    due: bool
    # live pipelines from before deployments existed, by their first run: adopted by the deployment whose
    # orchestrator knows that run
    legacy_origins: dict[str, int] = field(default_factory=dict)
    # this deployment's live pipelines and their first runs, checked against the orchestrator, which must hold
    # a pipeline's first run to act on it (see recovery.py)
    first_runs: list[FirstRun] = field(default_factory=list)
    foreign_orphans: list[ForeignOrphan] = field(default_factory=list)   # orphans of other deployments


DEFAULT_LAUNCH_GRACE = 300.0  # seconds a reclaimed pipeline waits for its resume run before it is an orphan again


@dataclass(frozen=True)
class PassPlan:
    """One recovery pass, in one write transaction: what the orchestrator said about the owner runs and the
    reservations, and how far the pass may go.

    ``grace_seconds``, ``max_age_seconds`` and ``limit`` left ``None`` are taken from the settings when
    :class:`~recovery_ext._recovery.protocol.RecoveryProtocol` runs the plan (launch grace, maximum age,
    ``max_per_scan``); the store itself reads them as the default launch grace, no age limit and no cap.
    ``launching``: the caller launches the resume runs at once (the orphan sensor), so each reclaimed pipeline
    is reserved for its resume run; otherwise it awaits a launcher. ``trigger`` names the pass in its events.
    """

    dead_owner_runs: tuple[str, ...] = ()
    retrying_owner_runs: tuple[str, ...] = ()
    canceled_owner_runs: tuple[str, ...] = ()
    extend_placeholders: tuple[str, ...] = ()
    adopt_pipelines: tuple[int, ...] = ()
    grace_seconds: float | None = None
    max_age_seconds: float | None = None
    limit: int | None = None
    launching: bool = False
    trigger: str = "on_demand"

    def __post_init__(self) -> None:
        for name in ("dead_owner_runs", "retrying_owner_runs", "canceled_owner_runs", "extend_placeholders",
                     "adopt_pipelines"):
            object.__setattr__(self, name, _names(f"PassPlan.{name}", getattr(self, name)))

    @property
    def launch_grace_seconds(self) -> float:
        return DEFAULT_LAUNCH_GRACE if self.grace_seconds is None else self.grace_seconds


@dataclass
class PassResult:
    adopted: int = 0
    canceled: list[int] = field(default_factory=list)
    extended: int = 0
    reclaimed: list[Reclaimed] = field(default_factory=list)
    claimed: list[Reclaimed] = field(default_factory=list)
    given_up: list[GivenUp] = field(default_factory=list)
    corrupt: list[GivenUp] = field(default_factory=list)
    awaiting: list[Reclaimed] = field(default_factory=list)


# -- the values the components' calls return ------------------------------------------------

@dataclass(frozen=True)
class ResetItem:
    id: int
    queue: str
    worker: str | None
    started_at: Any
    attempts: int
    max_attempts: int
    new_status: str
    payload: Any = None
    reason: str | None = None


@dataclass(frozen=True)
class StaleItem(QueueItem):
    """A stuck item with the reason the stale rule gives for it."""

    stale_reason: str = ""


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every figure the exporter shows, read in one transaction on the database clock."""

    pipeline_labels: tuple[str, ...]
    pipelines: list[tuple[tuple[str, ...], int]]          # (label values in pipeline_labels order, count)
    waiting_pipelines: list[tuple[str, str, int]]         # (job, what it waits on, count): shown as waiting
    expired_pipelines: list[tuple[str, int]]              # (job, count) running with an expired heartbeat
    oldest_heartbeat_age_seconds: float | None            # among running pipelines; None: none running
    reclaims: list[tuple[str, int]]                       # (cause, count)
    resume_runs: list[tuple[str, int]]                    # (cause, count)
    given_up: int
    items: list[tuple[str, str, int]]                     # (job, status, count) item checkpoints
    queue_items: list[tuple[str, str, int]]               # (queue, status, count)
    breakers: list[dict[str, Any]]                        # endpoint, state, consecutive_failures, open_count
    # (job, model, outcome, calls, tokens_in, tokens_out, cost) of every provider call in the ledger
    provider_calls: list[tuple[Any, ...]] = field(default_factory=list)
    # job -> the ledger's figures (calls, tokens, cost spent; saved by resume; wasted), as `recovery-ext costs`
    provider_costs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # corrupt ledger rows left out of the provider figures above
    skipped_ledger_rows: int = 0
    # the spend caps (spend_caps.CapState) of every deployment and of the running pipelines
    spend_caps: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class PipelineHistory:
    """One logical pipeline across its runs: what the report draws."""

    pipeline: Pipeline
    nodes: list[Node]
    transitions: list[dict[str, Any]]
    events: list[dict[str, Any]]
    # (epoch, run_id, node, status, count, first completed_at, last completed_at) of item checkpoints
    items: list[dict[str, Any]]
    # (epoch, completed_at) of each item checkpoint in time order, at most ITEM_TIMES_LIMIT of them
    item_times: list[tuple[int | None, dt.datetime]]
    now: dt.datetime
    # Each provider call of the pipeline, oldest first (at most ITEM_TIMES_LIMIT): epoch, recorded_at,
    # tokens, cost and its fate (kept, saved, wasted, open), and the ledger's figures for the pipeline.
    calls: list[dict[str, Any]] = field(default_factory=list)
    costs: dict[str, Any] = field(default_factory=dict)
    # Past ITEM_TIMES_LIMIT, item_times and calls hold every step-th row across the whole span (the last
    # one always), so every run is drawn; these count all of them, as the database does.
    item_count: int = 0
    item_times_step: int = 1
    call_count: int = 0
    calls_step: int = 1
    # (epoch, fate) -> calls, tokens, cost of every well-formed call, summed by the database
    call_figures: list[dict[str, Any]] = field(default_factory=list)
    # the pipeline's spend cap and its deployment's (spend_caps.CapState), where set
    spend_caps: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class PipelineBeat:
    """The run worker keeps the pipeline row alive."""

    own: Ownership
    timeout: float


@dataclass(frozen=True)
class NodeBeat:
    """A step keeps its running node alive (only while the pipeline is still ``own``'s)."""

    own: Ownership
    node: str
    timeout: float


@dataclass(frozen=True)
class WatchedNode:
    id: int
    pipeline_id: int
    name: str
    process: str


class Backoff(Protocol):
    """A retry backoff (:class:`~recovery_ext.wait_jittered_exponential`): the seconds before attempt ``n``."""

    def delay(self, attempt_number: int) -> float: ...


class Upserts(Protocol):
    """What a fenced transaction uses of the store: its upsert, in the transaction's connection."""

    def upsert(self, conn: Connection, table: Any, rows: Sequence[dict[str, Any]], *, keys: Sequence[str]) -> None:
        ...


class FencedTransaction:
    """One fenced write transaction; usable only inside its ``with`` block."""

    def __init__(self, db: Upserts, conn: Connection, own: Ownership) -> None:
        self._db = db
        self._conn: Connection | None = conn
        self.ownership = own

    @property
    def pipeline_id(self) -> int:
        return self.ownership.pipeline_id

    def _open(self) -> Connection:
        if self._conn is None:
            raise StoreError("this fenced transaction has ended; open a new one with ctx.transaction()")
        return self._conn

    def execute(self, statement: Any, parameters: Any = None) -> Any:
        """Run a SQLAlchemy Core statement inside the fenced transaction."""
        return self._open().execute(statement, parameters)

    def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return self._open().scalar(statement, parameters)

    def upsert(self, table: Any, rows: Sequence[dict[str, Any]], *, keys: Sequence[str]) -> None:
        """Insert or update ``rows`` by ``keys``, so a re-run node writes the same rows again."""
        self._db.upsert(self._open(), table, rows, keys=keys)

    def close(self) -> None:
        self._conn = None
