"""Plain values the store returns. Rows become these so callers never hold a live cursor.

Every type the store's interfaces (interfaces.py) name comes from here: these values, the values of the provider
calls and of the operator's calls (provider_values.py and admin_values.py, imported through this module only),
and the one handle the store gives out, :class:`FencedTransaction` (what user code writes through; valid only
inside its ``with`` block, opened by the store's pipelines).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Self, TypeVar, cast

from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError, StoreError
from recovery_ext._settings import LONGEST
from recovery_ext._json_values import storable_json
from recovery_ext._store.statuses import FINISHED_NODE_STATUSES, WAITING, BreakerState, ItemStatus, PipelineStatus

# The values of the provider calls and of the operator's calls live in their own modules, and come through here:
# every value the store's interfaces name is imported from models.
from recovery_ext._store.admin_values import GAP_WINDOW as GAP_WINDOW
from recovery_ext._store.admin_values import EventCursor as EventCursor
from recovery_ext._store.admin_values import Migration as Migration
from recovery_ext._store.admin_values import PruneResult as PruneResult
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

# A trillion tokens, beyond any real call: a column of them sums within 64 bits (SQLite's SUM fails on
# an overflow, and every report sums the ledger).
MAX_TOKENS = 2**40
_MAX_TOKENS = MAX_TOKENS
_CALL_TEXT = ("endpoint", "model", "outcome", "operation", "provider", "response_model", "note")
# The ledger's rolled-up totals are keyed by a call's model and outcome (and PostgreSQL's index entries hold at
# most 2,704 bytes): a model name is often the provider's own word (a batch result's "model", Azure's modelId),
# so a longer one, from no real provider, is kept cut to this many characters rather than failing the write.
CALL_KEY_TEXT_CHARS = 200
# What no database's text keeps: a NUL (PostgreSQL refuses it, SQLite keeps it) and a lone surrogate (no UTF-8
# form: json.loads gives one for a "\ud800" escape in a provider's answer, as its model name, say)
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class ProviderCall:
    """One call to a provider (an LLM request, an OCR page), as the ledger records it.

    A client fills in what it knows: ``endpoint``, ``model``, the tokens from the response's
    ``usage``, the latency and the ``outcome`` (``"ok"`` or the error's category). ``cost`` is
    optional (see :class:`Prices`). The ledger fills in the rest (pipeline, node, item, run and
    epoch) from the node the call was made in. ``id`` is made here, so the row can be written
    at once or later with the item's checkpoint, and never twice.

    ``operation`` (``"chat"`` when not given), ``provider`` and ``response_model`` only name the
    call in OpenTelemetry (``gen_ai.operation.name``, ``gen_ai.provider.name``,
    ``gen_ai.response.model``; see :func:`instrument_opentelemetry`); the ledger does not store them.
    Nor does it store ``cache_read_tokens``, ``cache_write_tokens`` (input tokens served from and written to
    the provider's prompt cache) and ``reasoning_tokens`` (output tokens spent reasoning): parts of
    ``tokens_in`` and ``tokens_out``, which include them, as the GenAI conventions count them
    (:func:`read_usage_details` reads them from OpenAI's, Anthropic's and Gemini's usage).
    """

    endpoint: str
    model: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_seconds: float = 0.0
    outcome: str = "ok"
    cost: float | None = None
    item_key: str | None = None
    pipeline_id: int | None = None
    node_name: str | None = None
    run_id: str | None = None
    epoch: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    operation: str | None = field(default=None, kw_only=True)
    provider: str | None = field(default=None, kw_only=True)
    response_model: str | None = field(default=None, kw_only=True)
    # Why a figure is not what the provider said (its usage was unreadable, recorded as 0), else None.
    note: str | None = field(default=None, kw_only=True)
    # Parts of tokens_in and tokens_out the provider reported (None: it did not say), for OpenTelemetry
    # (gen_ai.usage.cache_read.input_tokens, ...cache_creation.input_tokens, ...reasoning.output_tokens).
    cache_read_tokens: int | None = field(default=None, kw_only=True)
    cache_write_tokens: int | None = field(default=None, kw_only=True)
    reasoning_tokens: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        # The same call must be recordable on both databases, and its checkpoint must not fail after it was paid
        # for: a NUL or a lone surrogate becomes U+FFFD (the usual ASCII text is settled by isascii at once).
        for name in _CALL_TEXT:
            value = getattr(self, name)
            if type(value) is str and ("\x00" in value or not value.isascii()) and UNSTORABLE_TEXT.search(value):
                object.__setattr__(self, name, UNSTORABLE_TEXT.sub("\ufffd", value))
        for name in ("model", "outcome"):
            value = getattr(self, name)
            if type(value) is str and len(value) > CALL_KEY_TEXT_CHARS:
                object.__setattr__(self, name, value[:CALL_KEY_TEXT_CHARS])
        # Runs once per recorded call, on the item's hot path: the exact-type checks settle the usual
        # values at once, and only an unusual one pays for the full check and its message.
        if not (type(self.tokens_in) is int and 0 <= self.tokens_in < _MAX_TOKENS
                and type(self.tokens_out) is int and 0 <= self.tokens_out < _MAX_TOKENS):
            for name in ("tokens_in", "tokens_out"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_TOKENS:
                    raise ConfigurationError(
                        f"ProviderCall.{name} must be a whole number of tokens >= 0, got {value!r}")
        for name in ("latency_seconds", "cost"):
            value = getattr(self, name)
            if value is None and name == "cost":
                continue
            if type(value) is float and 0.0 <= value < math.inf:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigurationError(f"ProviderCall.{name} must be a finite number >= 0, got {value!r}")
        if not isinstance(self.endpoint, str) or not self.endpoint.strip():
            raise ConfigurationError("ProviderCall.endpoint must name the provider's endpoint")
        # whatever client records the call, the ledger (and every report of it) never holds a credential
        object.__setattr__(self, "endpoint", redact_url(self.endpoint))
        if not isinstance(self.outcome, str) or not 0 < len(self.outcome) <= 64:
            raise ConfigurationError(f"ProviderCall.outcome must be 'ok' or an error category, got {self.outcome!r}")
        for name in ("operation", "provider", "response_model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 200):
                raise ConfigurationError(f"ProviderCall.{name} must be a short name or None, got {value!r}")
        for name in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < _MAX_TOKENS):
                raise ConfigurationError(f"ProviderCall.{name} must be a whole number of tokens >= 0 or None, "
                                         f"got {value!r}")
        if self.note is not None and (not isinstance(self.note, str) or len(self.note) > 500):
            raise ConfigurationError(f"ProviderCall.note must be a short text or None, got {self.note!r:.80}")

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


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

    @classmethod
    def from_row(cls, mapping: Any) -> Self:
        return _from_mapping(cls, mapping)

    @property
    def shown_status(self) -> str:
        """``waiting`` while a provider outage pauses the (still live) pipeline, else its status."""
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
    # a pipeline's first run to act on it (see ticks.py)
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

COST_KEYS = ("calls", "tokens_in", "tokens_out", "cost", "saved_calls", "saved_tokens", "saved_cost",
             "wasted_calls", "wasted_tokens", "wasted_cost", "replayed_calls", "in_flight_unknown_calls")


@dataclass(frozen=True)
class BreakerDecision:
    """What a caller may do now: call (maybe as the one half-open probe) or wait ``wait_seconds``."""

    allowed: bool
    state: str = BreakerState.CLOSED
    probe: bool = False
    failures: int = 0
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class Reopened:
    pipeline_id: int
    job_name: str
    nodes: tuple[str, ...]
    items: int
    resume_number: int


@dataclass(frozen=True)
class ProviderJobRow:
    token: str
    provider: str
    job_id: str | None
    status: str
    items: tuple[str, ...]
    attempt: int
    call_id: str
    created_at: dt.datetime | None = None  # when its intent was recorded (the database's clock)
    # A job submitted part by part (``submit_by_parts``), while still submitting: each item the provider
    # accepted -> its part's id, and the item whose submission may be on its way (None: none was)
    accepted: Mapping[str, str] = field(default_factory=dict)
    sending: str | None = None


@dataclass(frozen=True)
class JournalHit:
    """A journaled answer (its JSON text) and the ledger row of the call that paid for it."""

    answer: str
    call: ProviderCall


@dataclass(frozen=True)
class JournalWrite:
    """One of a journaled call's fenced writes, as a batch of them (``journal_writes``) takes it.

    ``answered`` False: the begin (look ``call_key`` up, else write ``call`` in flight); True: the answer
    (keep ``answer`` under ``call_key`` and complete ``call``'s ledger row)."""

    call: ProviderCall
    call_key: str | None
    answered: bool = False
    answer: str | None = None


@dataclass
class CostFigures:
    """Calls, tokens and cost spent; saved by resume; wasted. ``cost`` sums the calls that had a price."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    saved_calls: int = 0
    saved_tokens: int = 0
    saved_cost: float = 0.0
    wasted_calls: int = 0
    wasted_tokens: int = 0
    wasted_cost: float = 0.0
    replayed_calls: int = 0           # of the saved calls: answers the journal handed to a later owner
    in_flight_unknown_calls: int = 0  # requests sent whose answer never arrived (a kill): outcome unknown

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> CostFigures:
        """The figures of a row holding every :data:`COST_KEYS` column (sums come back as any number type)."""
        figures = cls()
        for key in COST_KEYS:
            setattr(figures, key, float(row[key]) if key.endswith("cost") else int(row[key]))
        return figures

    def add(self, other: CostFigures) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, Any]:
        values = asdict(self)
        return {key: round(values[key], 9) if key.endswith("cost") else values[key] for key in COST_KEYS}

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


@dataclass
class CostReport:
    """Figures for all pipelines, per pipeline and per node of each pipeline."""

    total: CostFigures
    pipelines: dict[int, CostFigures]
    nodes: dict[int, dict[str, CostFigures]]
    jobs: dict[int, str]
    skipped_rows: int = 0  # corrupt ledger rows left out of the figures (see ledger.py: well_formed_call)

    def as_dict(self) -> dict[str, Any]:
        return {**self.total.as_dict(), "skipped_rows": self.skipped_rows,
                "pipelines": [{"pipeline_id": pid, "job": self.jobs.get(pid), **figures.as_dict(),
                               "nodes": {name: n.as_dict() for name, n in sorted(self.nodes.get(pid, {}).items())}}
                              for pid, figures in sorted(self.pipelines.items())]}


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
