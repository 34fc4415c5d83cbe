"""Sensor factories: the orphan sensor (reclaim, resume, stop the superseded) and the stuck-item sensor."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import cast, Any

from dagster import (
    BetaWarning,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from recovery_ext._dagster.resources import RecoveryResource
from recovery_ext._dagster.resume_runs import DagsterRunControl, OriginRuns
from recovery_ext._recovery.protocol import RecoveryProtocol
from recovery_ext._store.models import Scope
from recovery_ext._store.statuses import PipelineStatus, QueueStatus

log = logging.getLogger("recovery_ext.sensors")

# Dagster's implicit asset job: what asset backfills and materializations launched from the UI run.
ASSET_JOB = "__ASSET_JOB"

TAG_QUEUE = "recovery/queue"
ACTIVE_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                   DagsterRunStatus.STARTED]
# Dagster's sensor daemon evaluates a sensor at most this often, whatever its minimum_interval_seconds.
DAGSTER_SENSOR_FLOOR_SECONDS = 5


class RecoverySensorDefinition(SensorDefinition):
    """A sensor of this library: the same definition, copied by Dagster without a spurious BetaWarning.

    When ``Definitions`` binds resources to a sensor's jobs it copies the sensor (``with_attributes``)
    and passes the copy the sensor's ``owners``, an empty list nobody set, which Dagster flags as a beta
    parameter: every ``dagster dev`` start warned about it. Only that warning is left out of the copy.
    """

    def with_attributes(self, **kwargs: Any) -> SensorDefinition:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Parameter `owners`", category=BetaWarning)
            copy = super().with_attributes(**kwargs)
        copy.__class__ = RecoverySensorDefinition  # Dagster builds the copy as a plain SensorDefinition
        return copy


def _ours(sensor_def: SensorDefinition, factory: str, interval: int) -> RecoverySensorDefinition:
    if interval < DAGSTER_SENSOR_FLOOR_SECONDS:
        warnings.warn(f"{factory}(minimum_interval_seconds={interval}): Dagster's sensor daemon evaluates a sensor "
                      f"at most every {DAGSTER_SENSOR_FLOOR_SECONDS} s, so {sensor_def.name} ticks every "
                      f"{DAGSTER_SENSOR_FLOOR_SECONDS} s, not {interval} s", UserWarning, stacklevel=3)
    sensor_def.__class__ = RecoverySensorDefinition
    return cast(RecoverySensorDefinition, sensor_def)  # its class was just swapped; mypy cannot see that


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
) -> RecoverySensorDefinition:
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
    protocols: dict[Scope, RecoveryProtocol] = {}  # per deployment: when it last pruned events

    @sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            required_resource_keys={resource_key}, **target,
            description=f"Finds orphaned pipelines of {', '.join(job_names)} and launches resume runs.")
    def orphan_sensor(context: SensorEvaluationContext) -> SkipReason | SensorResult:
        resource: RecoveryResource = getattr(context.resources, resource_key)
        store = resource.get_store()
        scope = Scope(tuple(job_names), resource.deployment_name(context.instance), name)
        protocol = protocols.get(scope)
        if protocol is None:
            protocol = protocols[scope] = RecoveryProtocol(scope, max_per_tick=max_resumes_per_tick)
        last = context.last_tick_completion_time
        startup = context.is_first_tick_since_sensor_start or (
            last is not None and time.time() - last > max(startup_gap_factor * minimum_interval_seconds, 60.0))
        control = DagsterRunControl(context.instance, jobs_by_name, origin_runs,
                                    stop_budget_seconds=stop_budget_seconds)
        outcome = protocol.tick(store, control, resource.recovery_settings(),
                                trigger="startup" if startup else "sensor",
                                event_retention_seconds=resource.event_retention_seconds,
                                pipeline_retention_seconds=resource.finished_pipeline_retention_seconds)
        message = f"startup recovery: {outcome.message}" if startup else outcome.message
        stats = outcome.stats
        # A tick that requested runs shows only "N runs requested" in Dagster's tick list: its summary is in the
        # tick's logs (a skipped tick shows it as its skip reason).
        if stats.found or outcome.requests or stats.error or outcome.notes:
            context.log.info(message)
        if not outcome.requests:
            return SkipReason(message)
        return SensorResult(run_requests=outcome.requests)

    return _ours(orphan_sensor, "make_orphan_sensor", minimum_interval_seconds)


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
) -> RecoverySensorDefinition:
    """The queue's stale monitor: reset stuck ``processing`` items, mark exhausted ones ``dead``,
    and launch a queue run when items are claimable and no run for the queue is active.

    Stuck means the store's one rule (:meth:`Queue._stale_condition`, shared with
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
    def stuck_item_sensor(context: SensorEvaluationContext) -> SkipReason | SensorResult:
        store = getattr(context.resources, resource_key).get_store()
        reset = store.queue.reset_stale(queue=queue, older_than_seconds=stale_after_seconds, reason="stale item sensor")
        dead = [r.id for r in reset if r.new_status == QueueStatus.DEAD]
        ready = store.queue.count_ready(queue)
        waiting = store.queue.count_ready(queue, waiting=True)
        parts = [f"queue {queue}: {len(reset) - len(dead)} reset, {len(dead)} dead, {ready} ready"
                 + (f", {waiting} waiting for their retry delay" if waiting else "")]
        active = _draining_runs(context.instance, job_name, queue)
        # A running pipeline of the job with no live run has crashed: its resume run (the orphan sensor's,
        # launched within a tick) drains the queue. A run launched here meanwhile would only race it.
        crashed = [] if active or not ready else store.reports.list_pipelines(status=PipelineStatus.RUNNING,
                                                                       job_name=job_name, limit=1)
        if reset:
            context.log.info(parts[0] + "; " + "; ".join(f"item {r.id}: {r.reason}" for r in reset[:20]))
        if not ready or active or crashed:
            if active:
                parts.append(f"run {active[0].run_id} is draining it")
            elif crashed:
                parts.append(f"pipeline {crashed[0].id} of {job_name} is running or awaits its resume run, "
                             "which drains it")
            return SkipReason("; ".join(parts))
        request = RunRequest(run_key=f"queue-{queue}-{time.time_ns()}", job_name=job_name,
                             run_config=dict(run_config or {}), tags={TAG_QUEUE: queue})
        # Dagster shows a tick that requested runs as "1 run requested", with no message of the sensor's: the
        # summary goes to the tick's logs, as a skipped tick's goes to its skip reason.
        context.log.info("; ".join([*parts, f"requested a run of {job_name}"]))
        return SensorResult(run_requests=[request])

    return _ours(stuck_item_sensor, "make_stuck_item_sensor", minimum_interval_seconds)


def _draining_runs(instance: DagsterInstance, job_name: str, queue: str, limit: int = 100) -> list[DagsterRun]:
    """Active runs of the queue's job that drain this queue: those this sensor launched (tagged with the
    queue) and those launched without a queue tag (from the Launchpad, and their resume runs). Counting
    only the tagged ones launched a second run beside the resume run of a crashed Launchpad run."""
    runs = instance.get_runs(filters=RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES), limit=limit)
    return [run for run in runs if run.tags.get(TAG_QUEUE, queue) == queue]
