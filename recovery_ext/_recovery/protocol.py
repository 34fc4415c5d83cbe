"""The recovery protocol of one orphan-sensor tick, with the orchestrator behind a small interface.

A tick reads once (:meth:`Recovery.tick_snapshot`), asks the orchestrator what became of the owner
runs and of the resume runs it requested, writes once (:meth:`Recovery.recovery_pass`: cancel, extend
reservations, fail corrupt rows, give up, reclaim, reserve), then asks the orchestrator to launch the
resume runs that do not exist yet and to stop the runs the pass superseded. An idle tick is the read
alone. This module knows nothing of Dagster: :class:`RunControl` is what it needs, and the Dagster
sensor (``_dagster/sensors.py``) is a thin adapter that implements it.

Here too, so a reader of the tick finds all of it in one file: the pass's settings
(:class:`RecoverySettings`), its outage policy, its one-line summary, and when a tick prunes finished
pipelines (:class:`RetentionSchedule`). The scan (:func:`scan`) is the same pass with an orchestrator that
launches nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from recovery_ext._store.models import WaitKind, wait_kind
from recovery_ext._classify.redaction import redact
from recovery_ext._classify.retry import RetryPolicy
from recovery_ext._conventions import given_up_message, takeover_message
from recovery_ext._settings import check_count, check_seconds, env_bool, env_seconds
from recovery_ext._store.interfaces import SensorStore
from recovery_ext._store.models import DEFAULT_LAUNCH_GRACE, GivenUp, PassPlan, PassResult, Reclaimed, ScanStats
from recovery_ext._store.models import Scope, TickSnapshot

log = logging.getLogger("recovery_ext.protocol")
retention_log = logging.getLogger("recovery_ext.retention")

EVENT_RETENTION_EVERY = 3600.0  # seconds between two prunes of old events by one sensor process


@dataclass(frozen=True)
class RecoverySettings:
    """The orphan threshold, the on/off switch and the age limit. ``max_per_scan=None``: no cap.
    ``allow_long``: a launch grace past a day is accepted (the resource's ``allow_long_durations``); None: a day
    is the limit, and the error does not offer a switch (the environment has none)."""

    enabled: bool = True
    max_per_scan: int | None = 1000
    launch_grace_seconds: float = DEFAULT_LAUNCH_GRACE
    max_age_seconds: float | None = 24 * 3600.0
    allow_long: bool | None = None

    def __post_init__(self) -> None:
        if self.max_per_scan is not None:  # None: no cap
            check_count("max_per_scan", self.max_per_scan, minimum=1)
        check_seconds("launch_grace_seconds", self.launch_grace_seconds, minimum=1.0, allow_long=self.allow_long)
        check_seconds("max_age_seconds", self.max_age_seconds, minimum=1.0, maximum=366 * 86400.0, allow_none=True)

    def fill(self, plan: PassPlan) -> PassPlan:
        """``plan`` with the launch grace, maximum age and cap it leaves ``None`` taken from these settings."""
        return replace(plan,
                       grace_seconds=self.launch_grace_seconds if plan.grace_seconds is None else plan.grace_seconds,
                       max_age_seconds=self.max_age_seconds if plan.max_age_seconds is None else plan.max_age_seconds,
                       limit=self.max_per_scan if plan.limit is None else plan.limit)

    @classmethod
    def from_env(cls) -> RecoverySettings:
        return cls(
            enabled=env_bool("RECOVERY_ENABLE_ORPHAN_RECOVERY", True),
            launch_grace_seconds=env_seconds("RECOVERY_LAUNCH_GRACE", DEFAULT_LAUNCH_GRACE),
            max_age_seconds=env_seconds("RECOVERY_MAX_AGE", 24 * 3600.0, maximum=366 * 86400.0),
        )


def default_outage_policy(sleep: Callable[[float], None] | None = None) -> RetryPolicy:
    """A database outage during a scan is retried with exponential backoff, 3 attempts."""
    return RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=5.0, same_error_limit=3, sleep=sleep)


def summary_line(stats: ScanStats, launched: int | None = None) -> str:
    resumed = stats.reclaimed if launched is None else launched
    parts = [f"{stats.found} orphan{'s' if stats.found != 1 else ''}: {resumed} resumed, {stats.given_up} given up"]
    if stats.corrupt:
        parts.append(f"{stats.corrupt} corrupt")
    if stats.error:
        parts.append(f"error: {stats.error}")
    return "; ".join(parts)


PIPELINE_RETENTION_EVERY = 3600.0  # seconds between two prune passes of one sensor process
TICK_BUDGET_SECONDS = 5.0  # of batches per tick while a pass has prunable pipelines left


class RetentionSchedule:
    """One sensor process's prune passes: when the last began, and whether it is still under way."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, batch_size: int | None = None) -> None:
        self._clock = clock
        self.batch_size = batch_size
        self._started_at: float | None = None
        self._under_way = False

    def run(self, store: SensorStore, older_than_seconds: float | None, *, deployment: str | None) -> int:
        """Prune if a pass is due or under way; returns the pipelines deleted. Never raises (housekeeping: a
        failed batch is tried again at the next pass, an hour later)."""
        if older_than_seconds is None:
            return 0
        now = self._clock()
        if not self._under_way:
            if self._started_at is not None and now - self._started_at < PIPELINE_RETENTION_EVERY:
                return 0
            self._started_at = now
        try:
            result = store.reports.prune_finished_pipelines(older_than_seconds, deployment=deployment,
                                                    batch_size=self.batch_size, time_budget=TICK_BUDGET_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the tick goes on; every batch that committed stays done
            self._under_way = False
            retention_log.warning("could not prune finished pipelines: %s", redact(exc))
            return 0
        self._under_way = not result.done
        if result.pipelines:
            retention_log.info("pruned %d finished pipeline(s) older than %g s%s", result.pipelines, older_than_seconds,
                     " (more left: going on next tick)" if self._under_way else "")
        return result.pipelines


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

    def as_payload(self) -> dict[str, Any]:
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
        return given_up_message(r.pipeline_id, r.reason)
    return takeover_message(r.pipeline_id, r.cause, r.resume_number, r.heartbeat_age_seconds)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


class RecoveryProtocol:
    """One sensor's protocol state: its scope, when it last pruned old events and its prunes of finished
    pipelines."""

    def __init__(self, scope: Scope, *, max_per_tick: int | None = None,
                 policy: RetryPolicy | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.scope = scope
        self.max_per_tick = max_per_tick
        self.policy = policy or default_outage_policy()
        self._clock = clock
        self._pruned_at: float | None = None
        self.retention = RetentionSchedule(clock)

    def tick(self, store: SensorStore, control: RunControl, settings: RecoverySettings, *, trigger: str = "sensor",
             event_retention_seconds: float | None = None, plan: PassPlan | None = None,
             pipeline_retention_seconds: float | None = None) -> TickOutcome:
        """One pass: read, ask ``control``, write once, launch and stop through ``control``.

        With ``plan`` (the CLI's and startup scan) the pass runs as that plan says, without the read that
        decides whether a sensor tick has anything to do; what it leaves ``None`` comes from ``settings``.
        ``pipeline_retention_seconds``: finished pipelines older than this are pruned (see
        :class:`RetentionSchedule`); ``None`` keeps them.
        """
        stats = ScanStats()
        notes: list[str] = []
        started = time.perf_counter()
        if not settings.enabled:
            stats.error = "orphan recovery is disabled (RECOVERY_ENABLE_ORPHAN_RECOVERY=false)"
            return TickOutcome(stats, [], summary_line(stats), notes)
        if plan is not None:
            plan = settings.fill(plan)
            result = self._pass(store, plan, self.scope, stats, PassResult())
            return self._finish(store, control, self.scope, stats, result, ResumeStates(), notes, started,
                                plan.trigger, event_retention_seconds, waiting=(),
                                pipeline_retention_seconds=pipeline_retention_seconds)
        try:
            snap: TickSnapshot = self.policy.call(store.recovery.tick_snapshot, self.scope,
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
        scope, adopted = self._first_runs(snap, control, notes)
        adopt += adopted
        if scope.acting_on is not None and adopt:  # adopted legacy rows are this instance's too
            scope = replace(scope, acting_on=tuple(sorted({*scope.acting_on, *adopt})))
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
            result = self._pass(store, plan, scope, stats, result)
        return self._finish(store, control, scope, stats, result, resumes, notes, started, trigger,
                            event_retention_seconds, waiting=snap.waiting,
                            pipeline_retention_seconds=pipeline_retention_seconds)

    def _pass(self, store: SensorStore, plan: PassPlan, scope: Scope, stats: ScanStats, idle: PassResult) -> PassResult:
        """The pass's one write, retried through a database outage; a failure is reported in ``stats``."""
        try:
            return self.policy.call(store.recovery.recovery_pass, plan, scope)
        except Exception as exc:  # noqa: BLE001 - the pass reports; it never crashes its caller
            stats.failed, stats.error = 1, redact(f"{type(exc).__name__}: {exc}")
            log.error("recovery pass failed: %s", stats.error)
            return idle

    def _finish(self, store: SensorStore, control: RunControl, scope: Scope, stats: ScanStats, result: PassResult,
                resumes: ResumeStates, notes: list[str], started: float, trigger: str,
                event_retention_seconds: float | None, waiting: Sequence[dict[str, Any]],
                pipeline_retention_seconds: float | None = None) -> TickOutcome:
        """Count what the pass did, request the resume runs and stop the superseded runs through ``control``."""
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
                      if (a.owner not in resumes.existing or a.pipeline_id in fresh)
                      and (scope.acting_on is None or a.pipeline_id in scope.acting_on
                           or a.origin_run_id is None)]
        requests = control.resume_requests(to_request) if to_request else []
        again = sum(1 for a in to_request if a.pipeline_id not in fresh)
        if again:
            notes.append(f"{_plural(again, 'resume run')} re-requested (no run yet)")
        superseded: list[Reclaimed | GivenUp] = [*stats.reclaimed_pipelines, *stats.given_up_pipelines]
        stopped = control.stop_superseded(superseded) if superseded else []
        if stopped:
            terminated = sum(1 for s in stopped if s.terminate == "terminated")
            notes.append(f"{_plural(len(stopped), 'superseded run')} still live in Dagster: "
                         f"{terminated} terminated, {sum(s.marked_failed for s in stopped)} marked failed")
            try:
                store.recovery.record_superseded_runs([(s.pipeline_id, s.as_payload()) for s in stopped])
            except Exception as exc:  # noqa: BLE001
                notes.append(f"could not record stopped runs: {redact(exc)}")
        self._prune(store, event_retention_seconds)
        self.retention.run(store, pipeline_retention_seconds, deployment=scope.deployment)
        stats.duration_ms = (time.perf_counter() - started) * 1000
        message = "; ".join([summary_line(stats, launched=len(fresh)), *notes]) + _waiting_line(waiting)
        if stats.found or stats.error:
            log.info("recovery pass (%s): %s", trigger, message)
        return TickOutcome(stats, requests, message, notes)

    def _first_runs(self, snap: TickSnapshot, control: RunControl, notes: list[str]) -> tuple[Scope, list[int]]:
        """Only the orchestrator that holds a pipeline's first run acts on it: this tick's scope is the pipelines
        of this deployment whose first run it holds (standing aside for the others), and the orphans of other
        deployments it holds (a renamed deployment's), to adopt. The others are said out loud (see
        _store/recovery.py)."""
        # A first run that is no Dagster run id was not made by any Dagster instance (a pipeline created
        # outside Dagster): every sensor in scope may act on it, as before deployments.
        if self.scope.deployment is None:  # no deployment, no snapshot of first runs: any pipeline in scope
            return self.scope, []
        checked = [f for f in snap.first_runs if is_run_id(f.origin_run_id)]
        foreign = [f for f in snap.foreign_orphans if is_run_id(f.origin_run_id)]
        origins = [*(f.origin_run_id for f in checked), *(f.origin_run_id for f in foreign)]
        if not origins:
            return self._acting_on(snap.first_runs, []), []
        said: list[str] = []
        try:
            held = control.known_runs(origins)
        except Exception as exc:  # noqa: BLE001 - unproven: stand aside this tick, the next one asks again
            said.append(f"could not check first runs against Dagster, standing aside: {redact(exc)}")
            held = set()
        aside = sorted(f.pipeline_id for f in checked if f.origin_run_id not in held and f.actionable)
        if aside:
            said.append(f"stands aside for {_plural(len(aside), 'pipeline')} of deployment "
                         f"{self.scope.deployment!r} whose first run this Dagster instance does not hold (another "
                         f"instance uses the same deployment name; give each its own): "
                         f"{_ids(aside)}")
        stranded = [f for f in foreign if f.origin_run_id not in held and f.stale]
        if stranded:
            said.append(f"{_plural(len(stranded), 'orphaned pipeline')} of other deployments, not reclaimed past the "
                         "launch grace and not this Dagster instance's to resume: "
                         + ", ".join(f"{f.pipeline_id} ({f.deployment})" for f in stranded[:5])
                         + (", ..." if len(stranded) > 5 else "")
                         + " (is their deployment's sensor running, or was it renamed?)")
        for note in said:
            log.warning("%s", note)
        notes += said
        adopt = [f.pipeline_id for f in foreign if f.origin_run_id in held]
        mine = [f for f in snap.first_runs if not is_run_id(f.origin_run_id) or f.origin_run_id in held]
        return self._acting_on(mine, adopt), adopt

    def _acting_on(self, first_runs: Sequence[Any], adopt: Sequence[int]) -> Scope:
        """The scope of this tick's pass: only the pipelines whose first run was seen held (or is no Dagster run),
        and those it adopts. A pipeline past the snapshot's limit waits for a later tick, never unchecked."""
        return replace(self.scope, acting_on=tuple(sorted({*(f.pipeline_id for f in first_runs), *adopt})))

    def _prune(self, store: SensorStore, retention_seconds: float | None) -> None:
        """Old events go at most once per ``EVENT_RETENTION_EVERY`` per process: an idle tick stays one read."""
        now = self._clock()
        if retention_seconds is None or (self._pruned_at is not None and now - self._pruned_at < EVENT_RETENTION_EVERY):
            return
        self._pruned_at = now
        try:
            store.reports.prune_events(retention_seconds)
        except Exception as exc:  # noqa: BLE001 - housekeeping; tried again next time
            log.warning("could not delete old events: %s", redact(exc))


class LaunchNothing:
    """An orchestrator that knows no runs and launches nothing: the scan's (``recovery-ext recover``, startup).

    A pipeline it reclaims without launching keeps no owner until a sensor with a launcher requests its resume.
    """

    def owner_states(self, run_ids: Sequence[str]) -> OwnerStates:
        return OwnerStates()

    def resume_states(self, placeholders: Sequence[str]) -> ResumeStates:
        return ResumeStates()

    def known_runs(self, run_ids: Sequence[str]) -> set[str]:
        return set()

    def resume_requests(self, awaiting: Sequence[Reclaimed]) -> list[Any]:
        return []

    def stop_superseded(self, superseded: Sequence[Reclaimed | GivenUp]) -> list[StopOutcome]:
        return []


def scan(store: SensorStore, plan: PassPlan = PassPlan(), scope: Scope = Scope(), *,
         settings: RecoverySettings | None = None,
         policy: RetryPolicy | None = None) -> ScanStats:
    """One recovery pass over ``scope`` in one transaction, as ``plan`` says: the sensor's pass, launching nothing.

    What the plan leaves ``None`` comes from ``settings``: the launch grace, the maximum age and the cap
    on reclaims (``max_per_scan``). ``plan.launching`` reserves reclaimed pipelines for ``scope.launcher``.
    A database outage is retried with backoff (``policy``) and then reported in the stats; it never raises.
    """
    protocol = RecoveryProtocol(scope, policy=policy)
    return protocol.tick(store, LaunchNothing(), settings or RecoverySettings(), plan=plan).stats


def is_run_id(value: str) -> bool:
    """Whether ``value`` can be a Dagster run id (a UUID, as Dagster requires)."""
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _ids(ids: Sequence[int], limit: int = 5) -> str:
    return "pipeline " + ", ".join(map(str, ids[:limit])) + (", ..." if len(ids) > limit else "")


def _waiting_line(waiting: Sequence[dict[str, Any]], limit: int = 3) -> str:
    """The waiting pipelines of a tick's message, by what they wait on (an outage, a job, a cap, a budget)."""
    line = ""
    for kind in WaitKind:
        waits = [w for w in waiting if wait_kind(w["waiting_reason"]) == kind]
        if not waits:
            continue
        shown = [f"pipeline {w['id']} {kind.next_label} {w['waiting_until']:%H:%M:%S} UTC "
                 f"({(w['waiting_reason'] or '')[:80]})" for w in waits[:limit]]
        more = ", and more" if len(waits) > limit else ""
        line += f"; waiting on {kind.value}s: {'; '.join(shown)}{more}"
    return line
