"""What a waiting pipeline waits on, told from its waiting reason: one place for the CLI, the metrics, the
report, the sensors' messages and the engine events.

A pipeline row holds one wait (``waiting_until``, ``waiting_reason``); each kind of wait writes its reason
with its own prefix, and :func:`wait_kind` reads it back. A reason with no known prefix is an outage's
pause (the guard's and a node's retry pauses name the errors, not a prefix).
"""

from __future__ import annotations

from enum import StrEnum


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
