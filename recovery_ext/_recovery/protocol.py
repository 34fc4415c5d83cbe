"""The recovery protocol of one orphan-sensor tick, with the orchestrator behind a small interface.

A tick reads once (:meth:`TickOps.tick_snapshot`), asks the orchestrator what became of the owner
runs and of the resume runs it requested, writes once (:meth:`TickOps.recovery_pass`: cancel, extend
reservations, fail corrupt rows, give up, reclaim, reserve), then asks the orchestrator to launch the
resume runs that do not exist yet and to stop the runs the pass superseded. An idle tick is the read
alone. This module knows nothing of Dagster: :class:`RunControl` is what it needs, and the Dagster
sensor (``_dagster/sensors.py``) is a thin adapter that implements it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from recovery_ext._classify.redaction import redact
from recovery_ext._classify.retry import RetryPolicy
from recovery_ext._recovery.scan import RecoverySettings, default_outage_policy, summary_line
from recovery_ext._store.models import GivenUp, PassPlan, PassResult, Reclaimed, ScanStats, Scope, TickSnapshot

log = logging.getLogger("recovery_ext.protocol")

EVENT_RETENTION_EVERY = 3600.0  # seconds between two prunes of old events by one sensor process


@dataclass(frozen=True)
class OwnerStates:
    """What the orchestrator says about the owner runs of running pipelines."""

    dead: list[str] = field(default_factory=list)       # ended (failed, not being retried): orphans at once
    retrying: list[str] = field(default_factory=list)   # its own retry (or its user's cancel) takes it over
    canceled: list[str] = field(default_factory=list)   # canceled by their user: the pipeline is canceled


@dataclass(frozen=True)
class ResumeStates:
    """What the orchestrator says about the resume runs of reserved pipelines (by placeholder owner)."""

    existing: set[str] = field(default_factory=set)     # placeholders whose run exists (any status)
    waiting: list[str] = field(default_factory=list)    # queued or starting
    died: list[str] = field(default_factory=list)       # ended without attaching
    canceled: list[str] = field(default_factory=list)   # canceled by their user before attaching


@dataclass(frozen=True)
class StopOutcome:
    pipeline_id: int
    run_id: str
    terminate: str       # what the run launcher answered
    marked_failed: bool

    def as_payload(self) -> dict:
        return {"run_id": self.run_id, "terminate": self.terminate, "marked_failed": self.marked_failed}


class RunControl(Protocol):
    """What the protocol needs from the orchestrator."""

    def owner_states(self, run_ids: Sequence[str]) -> OwnerStates: ...

    def resume_states(self, placeholders: Sequence[str]) -> ResumeStates: ...

    def known_runs(self, run_ids: Sequence[str]) -> set[str]: ...

    def resume_requests(self, awaiting: Sequence[Reclaimed]) -> list[Any]: ...

    def stop_superseded(self, superseded: Sequence[Reclaimed | GivenUp]) -> list[StopOutcome]: ...


@dataclass
class TickOutcome:
    stats: ScanStats
    requests: list[Any]
    message: str
    notes: list[str]


def superseded_message(r: Reclaimed | GivenUp) -> str:
    """The message a superseded run is marked FAILURE with: what happened and what took over."""
    if isinstance(r, GivenUp):
        return f"recovery-ext: pipeline {r.pipeline_id} given up: {r.reason}"
    silent = f" for {r.heartbeat_age_seconds:.0f} s" if r.heartbeat_age_seconds is not None else ""
    why = {"owner_run_dead": "Dagster reported its run dead",
           "heartbeat": f"its run worker stopped heartbeating{silent}",
           "node_died": "a step process of it died (reported by the process that watched it)",
           "node_heartbeat": f"a step of it stopped heartbeating (run heartbeat silent{silent})",
           "stalled": "a node made no progress within its stall timeout",
           "deadline": "its hard deadline passed"}.get(r.cause or "", f"it was orphaned ({r.cause})")
    return (f"recovery-ext: pipeline {r.pipeline_id} was taken over because {why}; "
            f"resumed as resume #{r.resume_number} (run key recovery-{r.pipeline_id}-{r.resume_number})")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


class RecoveryProtocol:
    """One sensor's protocol state: its scope and when it last pruned old events."""

    def __init__(self, scope: Scope, *, max_per_tick: int | None = None,
                 policy: RetryPolicy | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.scope = scope
        self.max_per_tick = max_per_tick
        self.policy = policy or default_outage_policy()
        self._clock = clock
        self._pruned_at: float | None = None

    def tick(self, store, control: RunControl, settings: RecoverySettings, *, trigger: str = "sensor",
             event_retention_seconds: float | None = None) -> TickOutcome:
        stats = ScanStats()
        notes: list[str] = []
        started = time.perf_counter()
        if not settings.enabled:
            stats.error = "orphan recovery is disabled (RECOVERY_ENABLE_ORPHAN_RECOVERY=false)"
            return TickOutcome(stats, [], summary_line(stats), notes)
        try:
            snap: TickSnapshot = self.policy.call(store.tick_snapshot, self.scope,
                                                  grace_seconds=settings.launch_grace_seconds)
        except Exception as exc:  # noqa: BLE001 - reported in the tick, never raised into the sensor
            stats.failed, stats.error = 1, redact(f"{type(exc).__name__}: {exc}")
            log.error("recovery tick failed: %s", stats.error)
            return TickOutcome(stats, [], summary_line(stats), notes)
        owners, resumes, adopt = OwnerStates(), ResumeStates(), []
        try:
            owners = control.owner_states(snap.run_owners) if snap.run_owners else owners
            resumes = control.resume_states(snap.placeholders) if snap.placeholders else resumes
            if snap.legacy_origins:
                adopt = [snap.legacy_origins[r] for r in control.known_runs(list(snap.legacy_origins))]
        except Exception as exc:  # noqa: BLE001 - the database-clock part of the pass goes on
            notes.append(f"could not check running pipelines against Dagster: {redact(exc)}")
        dead = [*owners.dead, *resumes.died]
        canceled = [*owners.canceled, *resumes.canceled]
        extend = sorted(set(resumes.waiting) & set(snap.stale_placeholders))
        result = PassResult(awaiting=list(snap.awaiting))
        if snap.due or dead or canceled or extend or adopt:
            plan = PassPlan(dead_owner_runs=tuple(dead), retrying_owner_runs=tuple(owners.retrying),
                            canceled_owner_runs=tuple(canceled), extend_placeholders=tuple(extend),
                            adopt_pipelines=tuple(adopt),
                            grace_seconds=settings.launch_grace_seconds, max_age_seconds=settings.max_age_seconds,
                            limit=self.max_per_tick, launching=True, trigger=trigger)
            try:
                result = self.policy.call(store.recovery_pass, plan, self.scope)
            except Exception as exc:  # noqa: BLE001
                stats.failed, stats.error = 1, redact(f"{type(exc).__name__}: {exc}")
                log.error("recovery pass failed: %s", stats.error)
        stats.reclaimed_pipelines = [*result.reclaimed, *result.claimed]
        stats.given_up_pipelines = [*result.corrupt, *result.given_up]
        stats.corrupt = len(result.corrupt)
        stats.given_up = len(result.given_up) + stats.corrupt
        stats.reclaimed = len(result.reclaimed)
        stats.found = stats.reclaimed + stats.given_up
        for pipeline_id in result.canceled:
            log.info("pipeline %s canceled: its run was canceled by its user", pipeline_id)
        if resumes.waiting:
            notes.append(f"{_plural(len(resumes.waiting), 'resume run')} queued or starting in Dagster "
                         f"({_plural(result.extended, 'reservation')} extended)")
        if resumes.died:
            notes.append(f"{_plural(len(resumes.died), 'resume run')} ended before attaching")
        fresh = {r.pipeline_id: r for r in stats.reclaimed_pipelines}  # these know why they were reclaimed
        to_request = [fresh.get(a.pipeline_id, a) for a in result.awaiting
                      if a.owner not in resumes.existing or a.pipeline_id in fresh]
        requests = control.resume_requests(to_request) if to_request else []
        again = sum(1 for a in to_request if a.pipeline_id not in fresh)
        if again:
            notes.append(f"{_plural(again, 'resume run')} re-requested (no run yet)")
        superseded = [*stats.reclaimed_pipelines, *stats.given_up_pipelines]
        stopped = control.stop_superseded(superseded) if superseded else []
        if stopped:
            terminated = sum(1 for s in stopped if s.terminate == "terminated")
            notes.append(f"{_plural(len(stopped), 'superseded run')} still live in Dagster: "
                         f"{terminated} terminated, {sum(s.marked_failed for s in stopped)} marked failed")
            try:
                store.record_superseded_runs([(s.pipeline_id, s.as_payload()) for s in stopped])
            except Exception as exc:  # noqa: BLE001
                notes.append(f"could not record stopped runs: {redact(exc)}")
        self._prune(store, event_retention_seconds)
        stats.duration_ms = (time.perf_counter() - started) * 1000
        message = "; ".join([summary_line(stats, launched=len(fresh)), *notes]) + _waiting_line(snap.waiting)
        return TickOutcome(stats, requests, message, notes)

    def _prune(self, store, retention_seconds: float | None) -> None:
        """Old events go at most once per ``EVENT_RETENTION_EVERY`` per process: an idle tick stays one read."""
        now = self._clock()
        if retention_seconds is None or (self._pruned_at is not None and now - self._pruned_at < EVENT_RETENTION_EVERY):
            return
        self._pruned_at = now
        try:
            store.prune_events(retention_seconds)
        except Exception as exc:  # noqa: BLE001 - housekeeping; tried again next time
            log.warning("could not delete old events: %s", redact(exc))


def _waiting_line(waiting: Sequence[dict[str, Any]], limit: int = 3) -> str:
    if not waiting:
        return ""
    shown = [f"pipeline {w['id']} next try {w['waiting_until']:%H:%M:%S} UTC ({(w['waiting_reason'] or '')[:80]})"
             for w in waiting[:limit]]
    more = ", and more" if len(waiting) > limit else ""
    return f"; waiting on provider outages: {'; '.join(shown)}{more}"
