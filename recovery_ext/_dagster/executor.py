"""Run-level liveness: the run worker owns and heartbeats its pipeline from run start to run end.

``with_recovery(executor_def)`` wraps any Dagster executor (in-process, multiprocess, or one a
user brings) with the same name and config schema. Its ``execute`` runs the inner executor
inside a :class:`RunScope` that

- at run start creates the pipeline (a fresh run), attaches to it (a resume run, by its tags),
  or takes it over with a new epoch (a UI re-execution or a Dagster run retry, via the root run);
- heartbeats the pipeline row for the whole run: plain ops, step start-up, retry waits and
  pool waits included, because the run worker is alive through all of them;
- at run end applies the lifecycle: success skips the nodes it did not execute and completes
  the pipeline, a permanent failure fails it, a user's cancel cancels it, and a crash (a step
  process killed) leaves it running for recovery.

``@recoverable_op`` refuses to run outside such a scope, so no node ever runs without run liveness.
"""

from __future__ import annotations


import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, overload

from dagster import (
    DagsterExecutionInterruptedError,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    EnvVar,
    ExecuteInProcessResult,
    Executor,
    ExecutorDefinition,
    JobDefinition,
    build_resources,
    job,
    multiprocess_executor,
)

from recovery_ext._dagster.compat import EngineEventData, ExecutionPlan, PlanOrchestrationContext, make_new_run_id
from recovery_ext._conventions import in_process_origin, jsonable, resume_run_key, superseded_run_message
from recovery_ext._dagster.errors import DATABASE_OUTAGE
from recovery_ext._dagster.fences import execute_steps
from recovery_ext._errors import (IllegalTransition, MissingRunLiveness, NotFound, OwnershipLost, RecoveryError,
                                  StoreError)
from recovery_ext._liveness.heartbeat import HeartbeatSettings, Lease, ProcessWatch, mark_run_worker, registry_for
from recovery_ext._store.models import NodeSpec, Ownership
from recovery_ext._classify.redaction import redact
from recovery_ext._dagster.replay import carried_op_selection, replay_events, split_plan, subset_context
from recovery_ext._dagster.resources import RecoveryResource, in_process_deployment
from recovery_ext._dagster.run_state import report
from recovery_ext._dagster.tags import (TAG_NODE, TAG_OPTIONAL, TAG_PARENT_RUN, TAG_PIPELINE,
                                       TAG_RESUME_NUMBER, TAG_RESUMED_FROM, TAG_RETRY_NUMBER, TAG_ROOT_RUN,
                                       TAG_SUPERSEDED_BY, TAG_SUPERSEDED_CAUSE, NO_DAGSTER_RETRY)
from recovery_ext._store.runs import takeover_cause
from recovery_ext._store.statuses import NodeStatus, PipelineStatus
from recovery_ext._store.interfaces import OpStore

DEAD_RUN_STATUSES = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
CANCEL_STATUSES = (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)
CRASH_ERRORS = ("ChildProcessCrashException",)
# What made the takeover allowed, in words for the run's log.
CAUSES = {"pipeline_failed": "the pipeline had failed", "pipeline_canceled": "the pipeline had been canceled",
          "no_owner": "the pipeline had no owner", "owner_run_dead": "its run is FAILURE or CANCELED in Dagster",
          "heartbeat": "its run worker stopped heartbeating"}

_active_runs: set[str] = set()
_active_lock = threading.Lock()


def pipeline_nodes(job_def: JobDefinition) -> list[NodeSpec]:
    """The recoverable nodes of a job, in topological order."""
    specs = []
    for node in job_def.nodes_in_topological_order:
        tags = node.definition.tags or {}
        if tags.get(TAG_NODE) == "true":
            specs.append(NodeSpec(node.name, optional=tags.get(TAG_OPTIONAL) == "true"))
    return specs


def superseded_cause(reclaim: Mapping[str, Any]) -> str:
    """The ``recovery/superseded_cause`` tag of a run whose pipeline was reclaimed, from the reclaim's record: its
    cause, and for a heartbeat that went silent, for how long. How long it had been silent says why only when
    silence was the cause: a run Dagster reported dead, a stalled node or a passed deadline had heartbeats that
    were simply not due yet."""
    cause = str(reclaim.get("cause") or "orphaned")
    silent = reclaim.get("heartbeat_age_seconds")
    if cause in ("heartbeat", "node_heartbeat") and isinstance(silent, (int, float)):
        cause += f", {'node heartbeat' if cause == 'node_heartbeat' else 'heartbeat'} silent for {silent:.1f} s"
    return cause


def has_run_liveness(executor_def: ExecutorDefinition | None, run_id: str) -> bool:
    """Whether ``run_id`` runs under a run scope: a wrapped executor, or an in-process scope here."""
    with _active_lock:
        if run_id in _active_runs:
            return True
    return isinstance(executor_def, RecoveryExecutorDefinition)


def is_run_worker(run_id: str) -> bool:
    """Whether this process is the run worker of ``run_id`` (in-process execution), not a step process."""
    with _active_lock:
        return run_id in _active_runs


class RunScope:
    """The run worker's ownership of its pipeline, from :meth:`start` to :meth:`finish`."""

    def __init__(self, resource: RecoveryResource, run: DagsterRun, job_def: JobDefinition,
                 instance: DagsterInstance, log: Any = None, deployment: str | None = None,
                 origin_run_id: str | None = None) -> None:
        self.resource = resource
        self.deployment = deployment or resource.deployment_name(instance)
        self.origin_run_id = origin_run_id
        self.store: OpStore = resource.get_store()
        self.settings: HeartbeatSettings = resource.heartbeat_settings()
        self.run = run
        self.job_def = job_def
        self.instance = instance
        self.log = log
        self.own: Ownership | None = None
        self.lease: Lease | None = None
        self.how = ""
        self.takeover: dict[str, Any] = {}
        self._superseded: bool | None = None
        self.watch: ProcessWatch | None = None

    @property
    def ownership(self) -> Ownership:
        """The ownership :meth:`start` took (everything after it runs only once it did)."""
        if self.own is None:
            raise RecoveryError(f"run {self.run.run_id} has not taken its pipeline yet")
        return self.own

    # -- run start -------------------------------------------------------------------------------

    def start(self) -> Ownership:
        tags = self.run.tags
        run_id = self.run.run_id
        try:
            parent = tags.get(TAG_PARENT_RUN) or self.run.parent_run_id  # UI tags; execute_job sets only the field
            if parent:
                self.own = self._reexecution(tags, parent)
            elif TAG_PIPELINE in tags and TAG_RESUME_NUMBER in tags:
                self.own = self.store.pipelines.attach(int(tags[TAG_PIPELINE]), run_id,
                                             resume_number=int(tags[TAG_RESUME_NUMBER]),
                                             heartbeat_timeout=self.settings.timeout)
                self.how = f"attached to pipeline {self.own.pipeline_id} as resume #{tags[TAG_RESUME_NUMBER]}"
                cause = self._reclaim_cause(self.own.pipeline_id)
                self._point_forward(tags.get(TAG_RESUMED_FROM), self.own.pipeline_id,
                                    f"resume #{tags[TAG_RESUME_NUMBER]}", cause)
            else:
                self.own = self._create()
        except OwnershipLost as exc:
            status = exc.context.get("status")
            raise RecoveryError(
                f"run {run_id} cannot own pipeline {exc.context.get('pipeline_id')}: it is owned by {exc.owner}"
                + (f" (pipeline {status})" if status else "")
                + "; a re-execution takes over only once that run is dead or the pipeline failed or was canceled"
            ) from exc
        with _active_lock:
            _active_runs.add(run_id)
        mark_run_worker()  # the step processes this run worker starts watch it (they stop calling providers)
        registry = registry_for(self.store)
        self.watch = registry.watch_processes()  # and it watches them: vouches for the live, reports the dead
        self.lease = registry.register(self.own, self.settings)
        self._info(f"recovery-ext: {self.how}; the run worker heartbeats it every {self.settings.interval:g} s")
        if self.takeover:  # as visible on the new run as a reclaim by the orphan sensor
            report(self.instance, run_id, self.run.job_name, f"recovery-ext: {self.how}", metadata=self.takeover,
                   log=self.log)
        if tags.get(TAG_PIPELINE) != str(self.own.pipeline_id):
            self._tag_run()
        return self.own

    def _create_for_pruned(self, pipeline_id: int) -> Ownership:
        own = self._create()
        self.how += f" (re-execution of a run whose pipeline {pipeline_id} was pruned)"
        return own

    def _create(self) -> Ownership:
        own = self.store.pipelines.create_pipeline(
            self.job_def.name, pipeline_nodes(self.job_def), owner=self.run.run_id,
            origin_run_id=self.origin_run_id or self.run.run_id, params=jsonable(self.run.run_config or {}),
            limits=self.resource.pipeline_limits(), deployment=self.deployment,
        )
        self.how = f"created pipeline {own.pipeline_id}"
        return own

    def _reexecution(self, tags: Mapping[str, str], parent: str) -> Ownership:
        """A UI re-execution or a Dagster run retry: the same logical run, so the same pipeline."""
        root = tags.get(TAG_ROOT_RUN) or self.run.root_run_id or parent
        pipeline_id: int | None = int(tags[TAG_PIPELINE]) if TAG_PIPELINE in tags else None
        if pipeline_id is None:
            found = self.store.pipelines.find_pipeline(root)
            pipeline_id = found.id if found else (self.store.pipelines.formerly_owned_by(parent)
                                                  or self.store.pipelines.formerly_owned_by(root))
        if pipeline_id is None:
            return self._create()
        try:
            pipeline = self.store.pipelines.get_pipeline(pipeline_id)
        except NotFound:  # pruned by retention: nothing of it is left to reuse, so the re-execution is new work
            return self._create_for_pruned(pipeline_id)
        if pipeline.status == PipelineStatus.COMPLETED:
            own = self._create()  # a finished logical run: re-running it is new work
            self.how += f" (re-execution of the completed pipeline {pipeline_id})"
            return own
        dead = []
        if pipeline.owner:
            owner_run = self.instance.get_run_by_id(pipeline.owner)
            if owner_run is not None and owner_run.status in DEAD_RUN_STATUSES:
                dead.append(pipeline.owner)
        kind = "run retry" if tags.get(TAG_RETRY_NUMBER) else "re-execution"
        try:
            own = self.store.pipelines.take_over(pipeline_id, self.run.run_id, owner_dead=dead,
                                       heartbeat_timeout=self.settings.timeout, reason=f"{kind} of {parent}")
        except NotFound:  # a prune took the finished pipeline between the read above and this take-over
            return self._create_for_pruned(pipeline_id)
        why = CAUSES[takeover_cause(pipeline.status, pipeline.owner, dead)]
        self.how = (f"took over pipeline {pipeline_id} from run {pipeline.owner} as a {kind} of {parent} "
                    f"({why}); completed nodes and item checkpoints are reused")
        self.takeover = {"pipeline_id": pipeline_id, "previous_owner": pipeline.owner, "cause": why,
                         "epoch": own.epoch, "parent_run": parent}
        self._point_forward(pipeline.owner, pipeline_id, "a re-execution",
                            "re-executed after it died" if dead else "re-executed")
        return own

    def _reclaim_cause(self, pipeline_id: int) -> str:
        """Why the pipeline was reclaimed, as the reclaim recorded it (for the superseded run's tag and event)."""
        try:
            data = self.store.pipelines.last_reclaim(pipeline_id) or {}
        except Exception as exc:  # noqa: BLE001 - best effort: it only words the pointer
            return f"orphaned (cause unknown: {redact(exc)})"
        return superseded_cause(data)

    def _point_forward(self, previous_run_id: str | None, pipeline_id: int, role: str, cause: str) -> None:
        """The superseded run names the run that took over, as the new run names it: a tag and an engine event.

        Best effort: the pipeline row is the truth, and a run Dagster no longer has is left alone.
        """
        if not previous_run_id or previous_run_id == self.run.run_id:
            return
        try:
            previous = self.instance.get_run_by_id(previous_run_id)
            if previous is None:
                return
            self.instance.add_run_tags(previous_run_id, {TAG_SUPERSEDED_BY: self.run.run_id,
                                                         TAG_SUPERSEDED_CAUSE: cause})
            self.instance.report_engine_event(
                f"recovery-ext: superseded by run {self.run.run_id} ({role} of pipeline {pipeline_id}): "
                f"{cause}", previous)
        except Exception as exc:  # noqa: BLE001
            self._info(f"recovery-ext: could not point run {previous_run_id} to this run: {redact(exc)}")

    def _tag_run(self) -> None:
        """So a pipeline's history is one filter in the UI (best effort; the store is the truth)."""
        try:
            self.instance.add_run_tags(self.run.run_id, {TAG_PIPELINE: str(self.ownership.pipeline_id)})
        except Exception as exc:  # noqa: BLE001
            self._info(f"recovery-ext: could not tag run {self.run.run_id}: {redact(exc)}")

    def step_crashed(self) -> None:
        """The executor saw a step process die: report its node dead now, not at the next pulse."""
        if self.watch is not None:
            self.watch.check_quietly(self.settings.timeout)

    def superseded(self) -> bool:
        """Whether another run took the pipeline over (its heartbeat found the lease lost and the
        pipeline now has another owner or epoch; a pipeline this run completed is not superseded)."""
        if self._superseded is not None:
            return self._superseded
        if self.lease is None or self.lease.lost is None or self.own is None:
            return False
        try:
            current = self.store.pipelines.get_pipeline(self.own.pipeline_id)
        except StoreError:
            return False  # asked again at the next check
        self._superseded = current.epoch != self.own.epoch or current.owner != self.own.owner
        return self._superseded

    # -- run end ---------------------------------------------------------------------------------

    def finish(self, *, failures: list[Any], error: BaseException | None, interrupted: bool) -> str:
        """Apply the lifecycle for how the run ended; returns what happened (for the log)."""
        try:
            outcome = self._finish(failures, error, interrupted)
        except OwnershipLost as exc:
            outcome = self._already_ended(exc)
        except (StoreError, IllegalTransition) as exc:
            outcome = f"could not record the end of the run: {redact(exc)}; recovery will take it from here"
        except Exception as exc:  # noqa: BLE001 - never mask how the run itself ended
            outcome = (f"could not apply the end of the run ({type(exc).__name__}: {redact(exc)}); "
                       "recovery will take it from here")
        finally:
            if self.lease is not None:
                self.lease.release()
            with _active_lock:
                _active_runs.discard(self.run.run_id)
        self._info(f"recovery-ext: {outcome}")
        self._report_costs()
        return outcome

    def _report_costs(self) -> None:
        """An engine event on the run at its end: the pipeline's provider calls, tokens and cost (spent, saved by
        resume, wasted), when it made any. Best effort: a report never changes how the run ended."""
        if self.own is None:
            return
        try:
            figures = self.store.reports.provider_costs(self.own.pipeline_id).pipelines.get(self.own.pipeline_id)
            if figures is None or not figures.calls:
                return
            self.instance.report_engine_event(
                f"recovery-ext: pipeline {self.own.pipeline_id} provider calls: {figures.calls} "
                f"({figures.tokens} tokens, cost {figures.cost:g}); saved by resume: {figures.saved_calls} calls "
                f"({figures.saved_tokens} tokens); wasted: {figures.wasted_calls} calls ({figures.wasted_tokens} "
                "tokens)", self.run,
                EngineEventData(metadata={"pipeline_id": self.own.pipeline_id, **{
                    f"provider_{key}": value for key, value in figures.as_dict().items()}}))
        except Exception as exc:  # noqa: BLE001 - reporting never masks how the run ended
            self._info(f"recovery-ext: provider costs not reported: {redact(exc)}")

    def _finish(self, failures: list[Any], error: BaseException | None, interrupted: bool) -> str:
        own = self.ownership
        current = self.instance.get_run_by_id(self.run.run_id)
        if current is not None and current.status in CANCEL_STATUSES:
            self.store.pipelines.cancel_run(own, f"run {own.owner} was canceled by its user")
            return f"pipeline {own.pipeline_id} canceled with its run"
        if self.lease is not None and self.lease.lost is not None:
            raise self.lease.lost
        if interrupted:
            return (f"run interrupted without a cancel request; pipeline {own.pipeline_id} is left to recovery")
        if error is not None and _crashed_children(error):
            # The multiprocess executor raises once a step process died (kill -9, OOM): a crash,
            # not a verdict on the pipeline, so it is left to the node heartbeat and the orphan sensor.
            return self._leave_to_recovery(f"step process(es) died ({_crashed_children(error)}); pipeline "
                                           f"{own.pipeline_id} is left to recovery")
        if error is not None:
            self.store.pipelines.fail_run(own, f"{type(error).__name__}: {error}")
            return f"pipeline {own.pipeline_id} failed: the executor raised {type(error).__name__}"
        if failures:
            crashed = [f.step_key for f in failures if _is_crash(f)]
            running = [n.name for n in self.store.pipelines.list_nodes(own.pipeline_id)
                       if n.status == NodeStatus.RUNNING]
            if crashed or running:
                return self._leave_to_recovery(f"step process(es) {', '.join(crashed or running)} died; pipeline "
                                               f"{own.pipeline_id} is left to recovery")
            unreachable = [f.step_key for f in failures if _database_outage(f)]
            if unreachable:  # the step could not even mark its node (it may never have started it): no verdict
                return self._leave_to_recovery(f"step(s) {', '.join(unreachable)} found the recovery database "
                                               f"unavailable; pipeline {own.pipeline_id} is left to recovery")
            self.store.pipelines.fail_run(own, _failure_message(failures[0]))
            return f"pipeline {own.pipeline_id} failed: {_failure_message(failures[0])}"
        skipped = self.store.pipelines.complete_run(own)
        return (f"pipeline {own.pipeline_id} completed" +
                (f"; not executed by this run, recorded as skipped: {', '.join(skipped)}" if skipped else ""))

    def _leave_to_recovery(self, outcome: str) -> str:
        """This run is over and a step of it died: the orphan sensor may take the pipeline at its next tick.

        The heartbeat stops first, so no pulse extends it again; only then is the pipeline marked."""
        if self.lease is not None:
            self.lease.release()
        if self.store.pipelines.leave_to_recovery(self.ownership):
            return outcome + " at once"
        return outcome

    def _already_ended(self, exc: OwnershipLost) -> str:
        own = self.ownership
        try:
            current = self.store.pipelines.get_pipeline(own.pipeline_id)
        except StoreError:
            return f"pipeline {own.pipeline_id}: ownership lost ({exc.owner}); nothing written"
        if current.owner == own.owner and current.epoch == own.epoch:
            # still this run's: one of its own steps ended the pipeline (its last node completed it, or a
            # permanent error failed it) before the run did. Said as the run's outcome, not as news from elsewhere.
            return f"pipeline {current.id} {current.status}" + (f": {current.error}" if current.error else "")
        return f"pipeline {current.id} is no longer this run's (owner now {current.owner}); nothing written"

    def _info(self, message: str) -> None:
        if self.log is not None:
            self.log.info(message)


def _is_crash(event: Any) -> bool:
    data = getattr(event, "step_failure_data", None)
    error = getattr(data, "error", None)
    while error is not None:
        if error.cls_name in CRASH_ERRORS:
            return True
        error = error.cause
    return False


def _database_outage(event: Any) -> bool:
    """A step failed because the recovery database stayed unavailable past the store's retry budget
    (``recoverable._outage``): it left its node as it was, for the pipeline to resume once the database is back."""
    user = getattr(getattr(event, "step_failure_data", None), "user_failure_data", None)
    metadata = getattr(user, "metadata", None) or {}
    return all(getattr(metadata.get(key), "value", metadata.get(key)) == value
               for key, value in DATABASE_OUTAGE.items())


def _crashed_children(error: BaseException) -> int:
    """How many of the child-process errors inside a ``DagsterSubprocessError`` are crashes."""
    crashed = 0
    for info in getattr(error, "subprocess_error_infos", None) or ():
        while info is not None:
            if info.cls_name in CRASH_ERRORS:
                crashed += 1
                break
            info = info.cause
    return crashed


def _failure_message(event: Any) -> str:
    data = getattr(event, "step_failure_data", None)
    error = getattr(data, "error", None)
    user = getattr(data, "user_failure_data", None)
    text = (getattr(user, "description", None) or (error.message.strip() if error else "") or "step failed")
    return f"step {event.step_key} failed: {text}"


def resolve_resource(job_def: JobDefinition, run_config: Mapping[str, Any], instance: DagsterInstance,
                     resource_key: str, resource_def: Any = None) -> RecoveryResource:
    """The job's ``recovery`` resource as the run configures it, built in the run worker."""
    resource_def = resource_def if resource_def is not None else job_def.resource_defs.get(resource_key)
    if resource_def is None:
        raise MissingRunLiveness(f"job {job_def.name!r} uses run-level recovery but has no {resource_key!r} "
                                 "resource; add RecoveryResource() to its resources")
    config = (run_config.get("resources") or {}).get(resource_key)
    if config is None and isinstance(resource_def, RecoveryResource) and not any(
            isinstance(value, EnvVar) for value in vars(resource_def).values()):
        # Already complete: nothing in the run config or the environment to resolve. Building it again
        # would only repeat Dagster's schema inference for the class (tens of ms per run).
        return resource_def
    with build_resources({resource_key: resource_def}, instance=instance,
                         resource_config={resource_key: config} if config else None) as built:
        resource = getattr(built, resource_key)
    if not isinstance(resource, RecoveryResource):
        raise MissingRunLiveness(f"resource {resource_key!r} of job {job_def.name!r} is not a RecoveryResource")
    return resource


class RecoveringExecutor(Executor):
    """Runs the inner executor inside a :class:`RunScope`."""

    def __init__(self, inner: Executor, resource_key: str) -> None:
        self.inner = inner
        self.resource_key = resource_key

    def __getattr__(self, name: str) -> Any:
        # An executor's own loop reads its settings through the plan context's executor (dagster-celery:
        # ``job_context.executor.app_args()``), which is this wrapper: hand those to the inner executor.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # The wrapped executor's settings, as it declares them (their types are not Dagster's public API).
    @property
    def retries(self) -> Any:
        return self.inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self.inner.step_dependency_config

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[Any]:
        job_def = plan_context.job.get_definition()
        resource = resolve_resource(job_def, plan_context.run_config, plan_context.instance, self.resource_key)
        scope = RunScope(resource, plan_context.dagster_run, job_def, plan_context.instance, plan_context.log)
        scope.start()
        failures: list[Any] = []
        error: BaseException | None = None
        interrupted = False
        try:
            for event in self._events(scope, plan_context, execution_plan):
                if event.is_step_failure:
                    failures.append(event)
                    if _is_crash(event):
                        scope.step_crashed()
                yield event
        except (KeyboardInterrupt, DagsterExecutionInterruptedError, GeneratorExit):
            interrupted = True
            raise
        except Exception as exc:
            error = exc
            if not _superseded(scope):
                raise
        finally:
            scope.finish(failures=failures, error=error, interrupted=interrupted)
        if _superseded(scope):
            # The pipeline was reclaimed from this run: it ends FAILURE naming its resume run, and
            # as interrupted, so Dagster does not write a second failure over that message.
            current = plan_context.instance.get_run_by_id(scope.run.run_id)
            if current is not None and not current.is_finished:   # the orphan sensor usually marked it first
                plan_context.instance.add_run_tags(current.run_id, NO_DAGSTER_RETRY)
                plan_context.instance.report_run_failed(current, message=explain_supersession(
                    scope, plan_context.instance))
            raise DagsterExecutionInterruptedError(f"recovery-ext: run {scope.run.run_id} was superseded; "
                                                   f"pipeline {scope.ownership.pipeline_id} continues in another run")


    def _events(self, scope: RunScope, plan_context: PlanOrchestrationContext,
                execution_plan: ExecutionPlan) -> Iterator[Any]:
        """Replay the finished nodes here, then hand what is left to the inner executor."""
        split = split_plan(scope.job_def, execution_plan, scope.store, scope.ownership.pipeline_id,
                           carried_op_selection(plan_context.dagster_run))
        if split is None or not split.changes_plan:
            yield from self._inner_execute(scope, plan_context, execution_plan)
            return
        if split.unselected:
            scope._info("recovery-ext: resuming the op selection of the first run; "
                        f"not run: {', '.join(split.unselected)}")
        if split.left_out:
            scope._info(f"recovery-ext: finished in an earlier run, not run again: {', '.join(split.left_out)}")
        if split.replay:
            scope._info(f"recovery-ext: replaying {len(split.replay)} finished node(s) in the run worker: "
                        f"{', '.join(split.replay)}")
            failed = False
            for event in replay_events(plan_context, execution_plan, split.replay, scope.ownership.pipeline_id):
                failed = failed or event.is_step_failure
                yield event
            if failed:
                return
        if split.rest:
            context, subset = subset_context(plan_context, execution_plan, split.rest, [*split.replay, *split.ready])
            yield from self._inner_execute(scope, context, subset)

    def _inner_execute(self, scope: RunScope, plan_context: PlanOrchestrationContext,
                       execution_plan: ExecutionPlan) -> Iterator[Any]:
        yield from execute_steps(self.inner, plan_context, execution_plan, scope)


def _superseded(scope: RunScope) -> bool:
    return scope.superseded()


def explain_supersession(scope: RunScope, instance: DagsterInstance, wait_seconds: float = 15.0) -> str:
    """Which resume run took the pipeline over from this run, by run key and, once it exists, by run id."""
    import time

    from dagster import RunsFilter

    from recovery_ext._dagster.resume_runs import RUN_KEY_TAG

    own = scope.ownership
    try:
        pipeline = scope.store.pipelines.get_pipeline(own.pipeline_id)
    except Exception:  # noqa: BLE001 - the store may be out of reach from here
        return superseded_run_message(scope.run.run_id, own.pipeline_id, unknown=True)
    if pipeline.resume_count <= 0 or pipeline.epoch <= own.epoch:
        return superseded_run_message(scope.run.run_id, own.pipeline_id, owner=pipeline.owner)
    key = resume_run_key(own.pipeline_id, pipeline.resume_count)
    deadline = time.monotonic() + wait_seconds
    while True:
        runs = instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: key}), limit=1)
        if runs or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return superseded_run_message(scope.run.run_id, own.pipeline_id, resume_number=pipeline.resume_count,
                                  resume_run_id=runs[0].run_id if runs else None)


class RecoveryExecutorDefinition(ExecutorDefinition):
    """An executor definition whose executors keep the pipeline alive for the whole run."""

    def __init__(self, inner: ExecutorDefinition, resource_key: str = "recovery", **kwargs: Any) -> None:
        creation = inner.executor_creation_fn
        if creation is None:
            raise RecoveryError(f"executor {inner.name!r} has no executor_creation_fn to wrap")
        super().__init__(
            name=kwargs.pop("name", inner.name),
            config_schema=kwargs.pop("config_schema", inner.config_schema),
            requirements=inner.get_requirements,
            executor_creation_fn=lambda init_context: RecoveringExecutor(creation(init_context), resource_key),
            description=kwargs.pop("description", inner.description),
        )
        self.inner = inner
        self.resource_key = resource_key

    def copy_for_configured(self, name: str, description: str | None,
                            config_schema: Any) -> RecoveryExecutorDefinition:
        return RecoveryExecutorDefinition(self.inner, self.resource_key, name=name, config_schema=config_schema,
                                          description=description or self.description)


def with_recovery(executor_def: ExecutorDefinition = multiprocess_executor, *,
                  resource_key: str = "recovery") -> RecoveryExecutorDefinition:
    """Wrap any executor so the run worker keeps its pipeline alive from run start to run end."""
    if isinstance(executor_def, RecoveryExecutorDefinition):
        return executor_def
    return RecoveryExecutorDefinition(executor_def, resource_key)


@overload
def recoverable_job(fn: Callable[..., Any], *, executor_def: ExecutorDefinition = ...,
                    resource_key: str = ..., **job_kwargs: Any) -> JobDefinition: ...
@overload
def recoverable_job(fn: None = ..., *, executor_def: ExecutorDefinition = ..., resource_key: str = ...,
                    **job_kwargs: Any) -> Callable[[Callable[..., Any]], JobDefinition]: ...
def recoverable_job(fn: Callable[..., Any] | None = None, *, executor_def: ExecutorDefinition = multiprocess_executor,
                    resource_key: str = "recovery",
                    **job_kwargs: Any) -> JobDefinition | Callable[[Callable[..., Any]], JobDefinition]:
    """``@job`` whose executor (multiprocess by default) is wrapped with :func:`with_recovery`."""
    def decorate(body: Callable[..., Any]) -> JobDefinition:
        return job(executor_def=with_recovery(executor_def, resource_key=resource_key), **job_kwargs)(body)

    return decorate(fn) if fn is not None else decorate


@contextmanager
def _in_process_scope(job_def: JobDefinition, run_id: str, run_config: Mapping[str, Any], tags: Mapping[str, str],
                      instance: DagsterInstance, resource: RecoveryResource, deployment: str | None,
                      origin_run_id: str | None = None) -> Iterator[RunScope]:
    run = DagsterRun(job_name=job_def.name, run_id=run_id, run_config=dict(run_config), tags=dict(tags))
    scope = RunScope(resource, run, job_def, instance, deployment=deployment, origin_run_id=origin_run_id)
    scope.start()
    yield scope


def execute_in_process(job_def: JobDefinition, *, run_config: Mapping[str, Any] | None = None,
                       instance: DagsterInstance | None = None, resources: Mapping[str, Any] | None = None,
                       tags: Mapping[str, str] | None = None, raise_on_error: bool = True,
                       resource_key: str = "recovery", **kwargs: Any) -> ExecuteInProcessResult:
    """``job_def.execute_in_process`` with run-level liveness (Dagster swaps in its own executor there).

    The calling process is the run worker: it owns and heartbeats the pipeline around the run
    and applies the same lifecycle as :func:`with_recovery` when the run ends.

    Given no ``instance``, the run executes on a throw-away instance, as Dagster's own does, but its
    pipeline belongs to a stable deployment: ``RecoveryResource(deployment=...)`` or
    ``$RECOVERY_DEPLOYMENT``, else that of the Dagster instance under ``$DAGSTER_HOME``; and its first
    run is recorded as an in-process run, which no instance holds, so any sensor of that deployment may
    resume it. So if this process dies, the orphan sensor of ``dagster dev`` (or the daemon) with the same
    ``DAGSTER_HOME`` resumes the pipeline once its heartbeat expires. Without ``DAGSTER_HOME`` the
    deployment is ``in-process``, which no sensor serves.
    """
    run_config = dict(run_config or {})
    tags = dict(tags or {})
    run_id = make_new_run_id()
    owned_instance = instance is None
    instance = instance or DagsterInstance.ephemeral()
    try:
        resource = resolve_resource(job_def, run_config, instance, resource_key,
                                    resource_def=(resources or {}).get(resource_key))
        deployment = in_process_deployment(resource) if owned_instance else None
        origin = in_process_origin(run_id) if owned_instance else None
        with _in_process_scope(job_def, run_id, run_config, tags, instance, resource, deployment, origin) as scope:
            error: BaseException | None = None
            interrupted = False
            failures: list[Any] = []
            result = None
            try:
                result = job_def.execute_in_process(run_config=run_config, instance=instance, resources=resources,
                                                    tags=tags, raise_on_error=raise_on_error, run_id=run_id, **kwargs)
                failures = [e for e in result.all_events if e.is_step_failure]
            except KeyboardInterrupt:
                interrupted = True
                raise
            except Exception as exc:
                failures = [e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_step_failure]
                failures = [e.dagster_event for e in failures]
                if not failures:
                    error = exc
                raise
            finally:
                scope.finish(failures=failures, error=error, interrupted=interrupted)
            return result
    finally:
        if owned_instance:
            instance.dispose()
