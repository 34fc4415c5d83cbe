"""The provider component's values: a budget's limits and its grant, the spend caps, a cap as it stands and a
reservation's grant, and what a waiting pipeline waits on. Plain values, imported through models.py (their one
door: ``from recovery_ext._store.models import ProviderLimits``); the store's provider calls take and return them.

What a waiting pipeline waits on is told from its waiting reason, in one place for the CLI, the metrics, the
report, the sensors' messages and the engine events: a pipeline row holds one wait (``waiting_until``,
``waiting_reason``); each kind of wait writes its reason with its own prefix, and :func:`wait_kind` reads it
back. A reason with no known prefix is an outage's pause (the guard's and a node's retry pauses name the errors,
not a prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from recovery_ext._errors import ConfigurationError


# -- request and token budgets (budgets.py) ------------------------------------------------------------------

@dataclass(frozen=True)
class BudgetGrant:
    """A reservation's answer: granted (``reservation`` is its id) or wait ``wait_seconds`` and ask again."""

    granted: bool
    reservation: int | None = None
    wait_seconds: float = 0.0
    requests_in_window: int = 0
    tokens_in_window: int = 0


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
