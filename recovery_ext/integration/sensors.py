"""Sensor factories: the orphan sensor (seeds 000/001/004) and the stuck-item sensor (seed 003)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from ..models import GivenUp, ScanStats
from ..recovery import scan, summary_line
from ..redaction import redact
from .providers import waiting_summary
from .resources import RecoveryResource
from .resume_runs import (
    OriginRuns,
    classify_owner_runs,
    is_placeholder,
    resume_request,
    resume_run_key,
    stop_superseded,
    watch_resume_runs,
)

log = logging.getLogger("recovery_ext.sensors")

# Dagster's implicit asset job: what asset backfills and materializations launched from the UI run.
ASSET_JOB = "__ASSET_JOB"

TAG_QUEUE = "recovery/queue"
ACTIVE_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                   DagsterRunStatus.STARTED]


def make_orphan_sensor(
    jobs: Sequence[JobDefinition | str],
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    max_resumes_per_tick: int | None = None,
    resource_key: str = "recovery",
    startup_gap_factor: float = 3.0,
    stop_budget_seconds: float = 20.0,
):
    """Each tick runs the recovery scan for ``jobs`` and requests one resume run per reclaimed orphan.

    Every tick also re-requests the resume run of each pipeline this sensor reserved that has
    no run yet (the run key makes that idempotent), so a tick that fails after its reclaim
    committed still ends in exactly one resume run. A reservation waits ``launch_grace_seconds``
    for its run to attach, extended while Dagster shows that run queued or starting; a resume run
    that ends before attaching makes the pipeline an orphan again at once.

    ``max_resumes_per_tick`` caps the reclaims of one tick (``None``: no cap; Dagster's run queue
    paces the launches). Superseded runs Dagster still shows running are terminated through the
    instance's run launcher and marked FAILURE (best effort, at most ``stop_budget_seconds`` per tick).
    The first tick after the daemon (or this sensor) starts, or after a gap of
    ``startup_gap_factor`` intervals (at least a minute), is recorded as startup recovery
    (seed 000 steps 5-6).

    ``jobs`` may instead be ``[ASSET_JOB]``: Dagster's implicit asset job, whose runs (asset
    backfills, materializations from the UI) resume with their asset selection and partition.
    A Dagster sensor targets either job definitions or one job by name, so that is a second
    orphan sensor (default name ``recovery_asset_orphan_sensor``) beside the one for the jobs.
    """
    if max_resumes_per_tick is not None and max_resumes_per_tick < 1:
        raise ValueError("max_resumes_per_tick must be at least 1 (or None for no cap)")
    by_name = [j for j in jobs if isinstance(j, str)]
    if by_name and len(jobs) > 1:
        raise ValueError(f"a Dagster sensor targets job definitions or one job by name, not both: make one orphan "
                         f"sensor for {by_name[0]!r} and another for the jobs")
    target: dict[str, Any] = {"job_name": by_name[0]} if by_name else {"jobs": list(jobs)}
    name = name or ("recovery_asset_orphan_sensor" if by_name == [ASSET_JOB] else "recovery_orphan_sensor")
    jobs_by_name = {j.name: j for j in jobs if not isinstance(j, str)}
    origin_runs = OriginRuns()
    job_names = [*jobs_by_name, *by_name]

    @sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            required_resource_keys={resource_key}, **target,
            description=f"Finds orphaned pipelines of {', '.join(job_names)} and launches resume runs.")
    def orphan_sensor(context: SensorEvaluationContext):
        resource: RecoveryResource = getattr(context.resources, resource_key)
        store = resource.get_store()
        instance = context.instance
        grace = resource.launch_grace_seconds
        last = context.last_tick_completion_time
        startup = context.is_first_tick_since_sensor_start or (
            last is not None and time.time() - last > max(startup_gap_factor * minimum_interval_seconds, 60.0))
        trigger = "startup" if startup else "sensor"
        notes: list[str] = []
        dead: list[str] = []
        retrying: list[str] = []
        existing: dict[str, Any] = {}
        try:
            owners = store.running_owners(job_names=job_names)
            placeholders = [o for o in owners if is_placeholder(o)]
            owner_runs = classify_owner_runs(instance, [o for o in owners if not is_placeholder(o)])
            watch = watch_resume_runs(instance, placeholders)
            existing = watch.existing
            dead, retrying = owner_runs.dead + watch.died, owner_runs.retrying
            canceled = owner_runs.canceled + watch.canceled
            if canceled:  # backstop: the run worker normally records its user's cancel itself
                for pipeline_id in store.cancel_owned_by(canceled):
                    context.log.info(f"pipeline {pipeline_id} canceled: its run was canceled by its user")
            if watch.waiting:
                extended = store.extend_launch_grace(watch.waiting, grace)
                notes.append(f"{len(watch.waiting)} resume run{'s' if len(watch.waiting) != 1 else ''} queued or "
                             f"starting in Dagster ({extended} reservation{'s' if extended != 1 else ''} extended)")
            if watch.died:
                notes.append(f"{len(watch.died)} resume run{'s' if len(watch.died) != 1 else ''} ended before "
                             "attaching")
        except Exception as exc:  # noqa: BLE001 - the store being down is reported by the scan below
            context.log.warning(f"could not check running pipelines against Dagster: {redact(exc)}")
        settings = replace(resource.recovery_settings(), max_per_scan=max_resumes_per_tick)
        stats: ScanStats = scan(store, settings=settings, dead_owner_runs=dead, launching=True, trigger=trigger,
                                job_names=job_names, launcher=name, retrying_owner_runs=retrying)
        resource.enforce_event_retention(store)
        if stats.error is None:
            try:
                left = None if max_resumes_per_tick is None else max_resumes_per_tick - stats.reclaimed
                stats.reclaimed_pipelines += store.claim_awaiting(limit=left, grace_seconds=grace,
                                                                  job_names=job_names, launcher=name)
            except Exception as exc:  # noqa: BLE001
                context.log.warning(f"could not claim pipelines awaiting a resume: {redact(exc)}")
        fresh = {r.pipeline_id for r in stats.reclaimed_pipelines}
        try:
            waiting = [a for a in store.awaiting_resume(job_names=job_names)
                       if a.launcher in (name, None) and resume_run_key(a.pipeline_id, a.resume_number) not in existing]
        except Exception as exc:  # noqa: BLE001
            context.log.warning(f"could not list pipelines awaiting their resume run: {redact(exc)}")
            waiting = [r for r in stats.reclaimed_pipelines]
        origins = origin_runs.get(instance, [a.origin_run_id for a in waiting if a.origin_run_id])
        requests = [resume_request(a, origins.get(a.origin_run_id or ""), jobs_by_name.get(a.job_name))
                    for a in waiting]
        again = sum(1 for a in waiting if a.pipeline_id not in fresh)
        if again:
            notes.append(f"{again} resume run{'s' if again != 1 else ''} re-requested (no run yet)")
        stopped = stop_superseded(
            instance, [*stats.reclaimed_pipelines, *stats.given_up_pipelines],
            lambda r: (f"recovery-ext: pipeline {r.pipeline_id} given up: {r.reason}" if isinstance(r, GivenUp) else
                       f"recovery-ext: the run worker of pipeline {r.pipeline_id} stopped heartbeating; "
                       f"pipeline resumed as resume #{r.resume_number}"),
            budget_seconds=stop_budget_seconds)
        if stopped:
            terminated = sum(1 for s in stopped if s.terminate == "terminated")
            notes.append(f"{len(stopped)} superseded run{'s' if len(stopped) != 1 else ''} still live in Dagster: "
                         f"{terminated} terminated, {sum(s.marked_failed for s in stopped)} marked failed")
            try:
                store.record_superseded_runs([(s.pipeline_id, s.as_payload()) for s in stopped])
            except Exception as exc:  # noqa: BLE001
                context.log.warning(f"could not record stopped runs: {redact(exc)}")
        message = "; ".join([summary_line(stats, launched=len(fresh)), *notes]) + waiting_summary(store)
        if startup:
            message = f"startup recovery: {message}"
        if stats.found or requests or stats.error or notes:
            context.log.info(message)
        if not requests:
            return SkipReason(message)
        return SensorResult(run_requests=requests)

    return orphan_sensor


def make_stuck_item_sensor(
    job: JobDefinition,
    queue: str,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 60,
    stale_after_seconds: float = 600.0,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    run_config: Mapping[str, Any] | None = None,
    resource_key: str = "recovery",
):
    """Seed 003's stale monitor: reset stuck ``processing`` items, mark exhausted ones ``dead``,
    and launch a queue run when items are claimable and no run for the queue is active.

    Stuck means the store's one rule (:meth:`QueueOps.stale_condition`, shared with
    ``reset-stuck`` and ``status``): the item's heartbeat deadline passed, or the pipeline
    holding it was reclaimed; ``stale_after_seconds`` applies only to rows that have no
    heartbeat deadline (legacy rows). A document that keeps heartbeating is never reset,
    however long it takes.
    """
    if not stale_after_seconds > 0:
        raise ValueError("stale_after_seconds must be positive")
    job_name = job.name

    @sensor(name=name or f"recovery_stuck_items_{queue}", minimum_interval_seconds=minimum_interval_seconds,
            default_status=default_status, jobs=[job],
            required_resource_keys={resource_key},
            description=f"Resets stuck items of queue {queue!r} and launches {job_name} when items wait.")
    def stuck_item_sensor(context: SensorEvaluationContext):
        store = getattr(context.resources, resource_key).get_store()
        reset = store.reset_stale(queue=queue, older_than_seconds=stale_after_seconds, reason="stale item sensor")
        dead = [r.id for r in reset if r.new_status == "dead"]
        ready = store.count_ready(queue)
        waiting = store.count_ready(queue, waiting=True)
        parts = [f"queue {queue}: {len(reset) - len(dead)} reset, {len(dead)} dead, {ready} ready"
                 + (f", {waiting} waiting for their retry delay" if waiting else "")]
        active = context.instance.get_runs(
            filters=RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES, tags={TAG_QUEUE: queue}), limit=1)
        if reset:
            context.log.info(parts[0] + "; " + "; ".join(f"item {r.id}: {r.reason}" for r in reset[:20]))
        if not ready or active:
            if active:
                parts.append(f"run {active[0].run_id} is draining it")
            return SkipReason("; ".join(parts))
        request = RunRequest(run_key=f"queue-{queue}-{time.time_ns()}", job_name=job_name,
                             run_config=dict(run_config or {}), tags={TAG_QUEUE: queue})
        return SensorResult(run_requests=[request])

    return stuck_item_sensor
