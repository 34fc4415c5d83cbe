"""Sensor factories: the orphan sensor (seeds 000/001/004) and the stuck-item sensor (seed 003)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
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

from ..database import chunks
from ..models import Reclaimed, ScanStats
from ..recovery import scan, summary_line
from ..redaction import redact
from .providers import waiting_summary
from .tags import TAG_PARENT_RUN, TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM, TAG_WILL_RETRY
from .resources import RecoveryResource

log = logging.getLogger("recovery_ext.sensors")

TAG_QUEUE = "recovery/queue"
DEAD_STATUSES = [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
LIVE_STATUSES = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
ACTIVE_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                   DagsterRunStatus.STARTED]


def _owner_runs(instance, run_ids: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """Split owners Dagster already ended: (dead, not to be reclaimed, canceled by their user).

    Not to be reclaimed: a FAILURE run tagged ``dagster/will_retry=true`` (Dagster's own retry
    takes the pipeline over through the root run, unless that retry already ended) and a run
    its user is canceling (CANCELING: its steps are being stopped; it ends ``canceled``).
    """
    dead: list[str] = []
    protected: list[str] = []
    canceled: list[str] = []
    statuses = [*DEAD_STATUSES, DagsterRunStatus.CANCELING]
    for part in chunks(list(run_ids), 500):
        for r in instance.get_runs(filters=RunsFilter(run_ids=list(part), statuses=statuses)):
            if r.status == DagsterRunStatus.CANCELED:
                canceled.append(r.run_id)
            elif r.status == DagsterRunStatus.CANCELING:
                protected.append(r.run_id)
            elif r.tags.get(TAG_WILL_RETRY) == "true" and not _retry_ended(instance, r.run_id):
                protected.append(r.run_id)
            else:
                dead.append(r.run_id)
    return dead, protected, canceled


def _retry_ended(instance, run_id: str) -> bool:
    """Dagster's retry of ``run_id`` exists and finished without taking the pipeline over."""
    children = instance.get_runs(filters=RunsFilter(tags={TAG_PARENT_RUN: run_id}), limit=5)
    return any(c.status in DEAD_STATUSES or c.status == DagsterRunStatus.SUCCESS for c in children)


def _fail_stale_run(instance, run_id: str | None, message: str) -> bool:
    """Mark a run Dagster still shows as running FAILURE, so the UI never shows a dead run as running."""
    if not run_id:
        return False
    run = instance.get_run_by_id(run_id)
    if run is None or run.status not in LIVE_STATUSES:
        return False
    instance.report_run_failed(run, message=message)
    return True


def resume_request(r: Reclaimed) -> RunRequest:
    tags = {TAG_PIPELINE: str(r.pipeline_id), TAG_RESUME_NUMBER: str(r.resume_number),
            TAG_RESUMED_FROM: r.previous_owner or ""}
    return RunRequest(run_key=f"recovery-{r.pipeline_id}-{r.resume_number}", job_name=r.job_name,
                      run_config=r.params if isinstance(r.params, Mapping) else {}, tags=tags)


def make_orphan_sensor(
    jobs: Sequence[JobDefinition],
    *,
    name: str = "recovery_orphan_sensor",
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    max_resumes_per_tick: int = 10,
    resource_key: str = "recovery",
    startup_gap_factor: float = 3.0,
):
    """Each tick runs the recovery scan for ``jobs`` and launches one resume run per reclaimed orphan.

    The first tick after the daemon (or this sensor) starts, or after a gap of
    ``startup_gap_factor`` intervals (at least a minute), is recorded as startup recovery
    (seed 000 steps 5-6).
    """
    if max_resumes_per_tick < 1:
        raise ValueError("max_resumes_per_tick must be at least 1")
    job_names = [j.name for j in jobs]

    @sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            jobs=list(jobs), required_resource_keys={resource_key},
            description=f"Finds orphaned pipelines of {', '.join(job_names)} and launches resume runs.")
    def orphan_sensor(context: SensorEvaluationContext):
        resource: RecoveryResource = getattr(context.resources, resource_key)
        store = resource.get_store()
        instance = context.instance
        last = context.last_tick_completion_time
        startup = context.is_first_tick_since_sensor_start or (
            last is not None and time.time() - last > max(startup_gap_factor * minimum_interval_seconds, 60.0))
        trigger = "startup" if startup else "sensor"
        try:
            dead, retrying, canceled = _owner_runs(instance, store.running_owners(job_names=job_names))
            if canceled:  # backstop: the run worker normally records its user's cancel itself
                for pipeline_id in store.cancel_owned_by(canceled):
                    context.log.info(f"pipeline {pipeline_id} canceled: its run was canceled by its user")
        except Exception as exc:  # noqa: BLE001 - the store being down is reported by the scan below
            context.log.warning(f"could not list running pipelines: {redact(exc)}")
            dead, retrying = [], []
        stats: ScanStats = scan(store, settings=resource.recovery_settings(), dead_owner_runs=dead, launching=True,
                                limit=max_resumes_per_tick, trigger=trigger, job_names=job_names,
                                retrying_owner_runs=retrying)
        resource.enforce_event_retention(store)
        reclaimed = list(stats.reclaimed_pipelines)
        if stats.error is None and len(reclaimed) < max_resumes_per_tick:
            try:
                reclaimed += store.claim_awaiting(limit=max_resumes_per_tick - len(reclaimed),
                                                  grace_seconds=resource.launch_grace_seconds, job_names=job_names)
            except Exception as exc:  # noqa: BLE001
                context.log.warning(f"could not claim pipelines awaiting a resume: {redact(exc)}")
        requests = []
        for r in reclaimed:
            _fail_stale_run(instance, r.previous_owner,
                            f"recovery-ext: the run worker of pipeline {r.pipeline_id} stopped heartbeating; "
                            f"pipeline resumed as resume #{r.resume_number}")
            requests.append(resume_request(r))
        for g in stats.given_up_pipelines:
            _fail_stale_run(instance, g.previous_owner, f"recovery-ext: pipeline {g.pipeline_id} given up: {g.reason}")
        message = summary_line(stats, launched=len(requests)) + waiting_summary(store)
        if startup:
            message = f"startup recovery: {message}"
        if stats.found or requests or stats.error:
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
