"""The provider component's values: one provider call as the ledger records it, a budget's limits and its grant,
the spend caps, a cap as it stands and a reservation's grant, what a waiting pipeline waits on, and what the
provider calls return (a breaker's decision, a journaled answer, a provider job's row, the cost figures). Plain
values, imported through models.py (their one door: ``from recovery_ext._store.models import ProviderLimits``);
the store's provider calls take and return them.

What a waiting pipeline waits on is told from its waiting reason, in one place for the CLI, the metrics, the
report, the sensors' messages and the engine events: a pipeline row holds one wait (``waiting_until``,
``waiting_reason``); each kind of wait writes its reason with its own prefix, and :func:`wait_kind` reads it
back. A reason with no known prefix is an outage's pause (the guard's and a node's retry pauses name the errors,
not a prefix).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError
from recovery_ext._store.statuses import BreakerState


# -- one provider call (the ledger's row) --------------------------------------------------------------------

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



# -- request and token budgets (budgets.py) ------------------------------------------------------------------

@dataclass(frozen=True)
class BudgetGrant:
    """A reservation's answer: granted (``reservation`` is its id) or wait ``wait_seconds`` and ask again."""

    granted: bool
    reservation: int | None = None
    wait_seconds: float = 0.0
    requests_in_window: int = 0
    tokens_in_window: int = 0
    backing_off: bool = False  # the wait is everybody's back-off after a 429, not a full window


# What both databases store and sum: requests_per_minute is a PostgreSQL INTEGER column; token counts are
# BIGINT, and a window's reservations are summed, so the limit keeps far below 2**63.
LIMIT_MAXIMUM = {"requests_per_minute": 2**31 - 1, "tokens_per_minute": 2**53}


def check_limits(requests_per_minute: int | None, tokens_per_minute: int | None, window_seconds: float) -> None:
    for name, value in (("requests_per_minute", requests_per_minute), ("tokens_per_minute", tokens_per_minute)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= LIMIT_MAXIMUM[name]):
            raise ConfigurationError(f"{name} must be a whole number from 1 to {LIMIT_MAXIMUM[name]} (or unset), "
                                     f"got {value!r}")
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, (int, float)) \
            or not 0.1 <= window_seconds <= 86400:
        raise ConfigurationError(f"a budget window must be between 0.1 and 86400 seconds, got {window_seconds!r}")


@dataclass(frozen=True)
class ProviderLimits:
    """Requests and tokens a provider allows per ``window_seconds`` (a minute, unless scaled for a test).

    ``per_model``: each model of the endpoint has its own budget (else one for the whole endpoint).
    ``margin_seconds``: added to the window after a request's answer, for clock differences (default: 2 % of
    the window, at most 1 s); the time a request takes to reach the provider is covered by holding its room
    from its reservation until its answer.
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    per_model: bool = False
    window_seconds: float = 60.0
    margin_seconds: float | None = None

    def __post_init__(self) -> None:
        check_limits(self.requests_per_minute, self.tokens_per_minute, self.window_seconds)
        if self.margin_seconds is not None and (not isinstance(self.margin_seconds, (int, float))
                                                or isinstance(self.margin_seconds, bool)
                                                or not 0 <= self.margin_seconds <= self.window_seconds):
            raise ConfigurationError(f"margin_seconds must be between 0 and the window, got {self.margin_seconds!r}")

    @property
    def enabled(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None

    @property
    def margin(self) -> float:
        return self.margin_seconds if self.margin_seconds is not None else min(1.0, 0.02 * self.window_seconds)


# -- spend caps (spend_caps.py) ------------------------------------------------------------------------------

# Token caps stay far below what BIGINT sums hold; a money cap is any finite amount up to this.
CAP_MAX_TOKENS = 2**53
CAP_MAX_COST = 1e12


def pipeline_scope(pipeline_id: int) -> str:
    return f"pipeline:{int(pipeline_id)}"


def deployment_scope(deployment: str) -> str:
    return f"deployment:{deployment}"


def check_cap(name: str, value: object, *, money: bool) -> None:
    """A cap is unset (None), a whole number of tokens from 0, or a finite amount of money from 0."""
    if value is None:
        return
    if money:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= CAP_MAX_COST:
            raise ConfigurationError(f"{name} must be an amount from 0 to {CAP_MAX_COST:g} (or unset), got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= CAP_MAX_TOKENS:
        raise ConfigurationError(f"{name} must be a whole number of tokens from 0 to {CAP_MAX_TOKENS} (or unset), "
                                 f"got {value!r}")


@dataclass(frozen=True)
class SpendCaps:
    """The caps a pipeline is held to (any may be None: no cap of that kind), and how often a pipeline paused at
    a cap looks whether it was raised."""

    pipeline_tokens: int | None = None
    pipeline_cost: float | None = None
    deployment_tokens: int | None = None
    deployment_cost: float | None = None
    poll_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("pipeline_tokens", "deployment_tokens"):
            check_cap(f"spend cap {name}", getattr(self, name), money=False)
        for name in ("pipeline_cost", "deployment_cost"):
            check_cap(f"spend cap {name}", getattr(self, name), money=True)
        poll = self.poll_seconds
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0.01 <= poll <= 3600:
            raise ConfigurationError(f"spend_cap_poll_seconds must be between 0.01 and 3600, got {poll!r}")

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.pipeline_tokens, self.pipeline_cost, self.deployment_tokens,
                                           self.deployment_cost))

    def scopes(self, pipeline_id: int, deployment: str) -> list[tuple[str, int | None, float | None]]:
        """Each cap's scope with its tokens and money, in the order reservations take them (pipeline first:
        every process takes the rows in one order, so none waits for another in a circle)."""
        found = []
        if self.pipeline_tokens is not None or self.pipeline_cost is not None:
            found.append((pipeline_scope(pipeline_id), self.pipeline_tokens, self.pipeline_cost))
        if self.deployment_tokens is not None or self.deployment_cost is not None:
            found.append((deployment_scope(deployment), self.deployment_tokens, self.deployment_cost))
        return found


@dataclass(frozen=True)
class CapState:
    """One cap as it stands: its limits, what was spent, what is reserved, and what is left."""

    scope: str
    max_tokens: int | None
    max_cost: float | None
    spent_tokens: int
    spent_cost: float
    reserved_tokens: int
    reserved_cost: float
    changed_by: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> CapState:
        return cls(row.scope, None if row.max_tokens is None else int(row.max_tokens),
                   None if row.max_cost is None else float(row.max_cost), int(row.spent_tokens),
                   float(row.spent_cost), int(row.reserved_tokens), float(row.reserved_cost), row.changed_by)

    @property
    def left_tokens(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens - self.spent_tokens - self.reserved_tokens

    @property
    def left_cost(self) -> float | None:
        return None if self.max_cost is None else self.max_cost - self.spent_cost - self.reserved_cost

    def describe(self, tokens: int = 0, cost: float = 0.0) -> str:
        """Why a request of ``tokens`` (``cost``) does not fit, in one line."""
        parts = []
        if self.max_tokens is not None:
            parts.append(f"{self.spent_tokens} of {self.max_tokens} tokens spent, {self.reserved_tokens} reserved"
                         + (f", this request needs {tokens}" if tokens else ""))
        if self.max_cost is not None:
            parts.append(f"{self.spent_cost:.6g} of {self.max_cost:.6g} spent, {self.reserved_cost:.6g} reserved"
                         + (f", this request needs {cost:.6g}" if cost else ""))
        return f"{self.scope}: {'; '.join(parts)}; raise it with `recovery-ext spend-cap set`"

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "max_tokens": self.max_tokens, "max_cost": self.max_cost,
                "spent_tokens": self.spent_tokens, "spent_cost": round(self.spent_cost, 9),
                "reserved_tokens": self.reserved_tokens, "reserved_cost": round(self.reserved_cost, 9),
                "left_tokens": self.left_tokens,
                "left_cost": None if self.left_cost is None else round(self.left_cost, 9),
                "changed_by": self.changed_by}


@dataclass(frozen=True)
class SpendGrant:
    """A reservation's answer: its rows' ids (granted), or the cap that has no room for it."""

    reservations: tuple[int, ...] = ()
    full: CapState | None = None

    @property
    def granted(self) -> bool:
        return self.full is None


# -- what a waiting pipeline waits on ------------------------------------------------------------------------

class WaitKind(StrEnum):
    """What a pipeline waits on; each value but the outage's is its reasons' prefix (budgets.BUDGET_REASON, ...)."""

    OUTAGE = "provider outage"
    RATE_BUDGET = "rate budget"
    SPEND_CAP = "spend cap"
    PROVIDER_JOB = "provider job"

    @property
    def heading(self) -> str:
        """How `recovery-ext status` lists the pipelines waiting on it."""
        return {WaitKind.OUTAGE: "Waiting on a provider outage", WaitKind.RATE_BUDGET: "Waiting for a rate budget",
                WaitKind.SPEND_CAP: "Paused at a spend cap",
                WaitKind.PROVIDER_JOB: "Waiting on a provider job (batch, async OCR)"}[self]

    @property
    def doing(self) -> str:
        """What an engine event says the node is doing."""
        return {WaitKind.OUTAGE: "waiting out a provider outage", WaitKind.RATE_BUDGET: "waiting for the rate budget",
                WaitKind.SPEND_CAP: "paused at the spend cap",
                WaitKind.PROVIDER_JOB: "waiting on a provider job"}[self]

    @property
    def next_label(self) -> str:
        """What its ``waiting_until`` is: the next try of a call, or the next look at a job or a cap."""
        return "next try" if self in (WaitKind.OUTAGE, WaitKind.RATE_BUDGET) else "next check"


def wait_kind(reason: str | None) -> WaitKind:
    """The kind of wait ``reason`` (a pipeline's ``waiting_reason``) describes."""
    text = reason or ""
    for kind in (WaitKind.RATE_BUDGET, WaitKind.SPEND_CAP, WaitKind.PROVIDER_JOB):
        if text.startswith(kind.value):
            return kind
    return WaitKind.OUTAGE


# -- what the provider calls return --------------------------------------------------------------------------

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
