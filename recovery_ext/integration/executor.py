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
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    EnvVar,
    ExecutorDefinition,
    JobDefinition,
    build_resources,
    in_process_executor,
    job,
    multiprocess_executor,
)
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.executor.base import Executor
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.utils import make_new_run_id

from ..errors import IllegalTransition, OwnershipLost, RecoveryError, StoreError
from ..heartbeat import HeartbeatSettings, Lease, registry_for
from ..models import NodeSpec, Ownership
from ..redaction import redact
from ..store import RecoveryStore
from .replay import carried_op_selection, replay_events, split_plan, subset_context
from .resources import RecoveryResource
from .tags import TAG_NODE, TAG_OPTIONAL, TAG_PARENT_RUN, TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_ROOT_RUN

DEAD_RUN_STATUSES = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
CANCEL_STATUSES = (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)
CRASH_ERRORS = ("ChildProcessCrashException",)

_active_runs: set[str] = set()
_active_lock = threading.Lock()


class MissingRunLiveness(RecoveryError):
    """A recoverable op ran in a job whose executor does not keep the pipeline alive."""


def pipeline_nodes(job_def: JobDefinition) -> list[NodeSpec]:
    """The recoverable nodes of a job, in topological order."""
    specs = []
    for node in job_def.nodes_in_topological_order:
        tags = node.definition.tags or {}
        if tags.get(TAG_NODE) == "true":
            specs.append(NodeSpec(node.name, optional=tags.get(TAG_OPTIONAL) == "true"))
    return specs


def has_run_liveness(executor_def: ExecutorDefinition | None, run_id: str) -> bool:
    """Whether ``run_id`` runs under a run scope: a wrapped executor, or an in-process scope here."""
    with _active_lock:
        if run_id in _active_runs:
            return True
    return isinstance(executor_def, RecoveryExecutorDefinition)


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


class RunScope:
    """The run worker's ownership of its pipeline, from :meth:`start` to :meth:`finish`."""

    def __init__(self, resource: RecoveryResource, run: DagsterRun, job_def: JobDefinition,
                 instance: DagsterInstance, log: Any = None) -> None:
        self.resource = resource
        self.store: RecoveryStore = resource.get_store()
        self.settings: HeartbeatSettings = resource.heartbeat_settings()
        self.run = run
        self.job_def = job_def
        self.instance = instance
        self.log = log
        self.own: Ownership | None = None
        self.lease: Lease | None = None
        self.how = ""

    # -- run start -------------------------------------------------------------------------------

    def start(self) -> Ownership:
        tags = self.run.tags
        run_id = self.run.run_id
        try:
            parent = tags.get(TAG_PARENT_RUN) or self.run.parent_run_id  # UI tags; execute_job sets only the field
            if parent:
                self.own = self._reexecution(tags, parent)
            elif TAG_PIPELINE in tags and TAG_RESUME_NUMBER in tags:
                self.own = self.store.attach(int(tags[TAG_PIPELINE]), run_id,
                                             resume_number=int(tags[TAG_RESUME_NUMBER]),
                                             heartbeat_timeout=self.settings.timeout)
                self.how = f"attached to pipeline {self.own.pipeline_id} as resume #{tags[TAG_RESUME_NUMBER]}"
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
        self.lease = registry_for(self.store).register(self.own, self.settings)
        self._info(f"recovery-ext: {self.how}; the run worker heartbeats it every {self.settings.interval:g} s")
        if tags.get(TAG_PIPELINE) != str(self.own.pipeline_id):
            self._tag_run()
        return self.own

    def _create(self) -> Ownership:
        own = self.store.create_pipeline(
            self.job_def.name, pipeline_nodes(self.job_def), owner=self.run.run_id,
            origin_run_id=self.run.run_id, params=_jsonable(self.run.run_config or {}),
            heartbeat_timeout=self.settings.timeout, deadline_seconds=self.resource.hard_deadline_seconds,
            max_resumes=self.resource.max_resumes,
        )
        self.how = f"created pipeline {own.pipeline_id}"
        return own

    def _reexecution(self, tags: Mapping[str, str], parent: str) -> Ownership:
        """A UI re-execution or a Dagster run retry: the same logical run, so the same pipeline."""
        root = tags.get(TAG_ROOT_RUN) or self.run.root_run_id or parent
        pipeline_id: int | None = int(tags[TAG_PIPELINE]) if TAG_PIPELINE in tags else None
        if pipeline_id is None:
            found = self.store.find_pipeline(root)
            pipeline_id = found.id if found else (self.store.formerly_owned_by(parent)
                                                  or self.store.formerly_owned_by(root))
        if pipeline_id is None:
            return self._create()
        pipeline = self.store.get_pipeline(pipeline_id)
        if pipeline.status == "completed":
            own = self._create()  # a finished logical run: re-running it is new work
            self.how += f" (re-execution of the completed pipeline {pipeline_id})"
            return own
        dead = []
        if pipeline.owner:
            owner_run = self.instance.get_run_by_id(pipeline.owner)
            if owner_run is not None and owner_run.status in DEAD_RUN_STATUSES:
                dead.append(pipeline.owner)
        own = self.store.take_over(pipeline_id, self.run.run_id, owner_dead=dead,
                                   heartbeat_timeout=self.settings.timeout)
        self.how = (f"took over pipeline {pipeline_id} from {pipeline.owner} ({pipeline.status}) as a "
                    f"re-execution of {parent}; completed nodes and item checkpoints are reused")
        return own

    def _tag_run(self) -> None:
        """So a pipeline's history is one filter in the UI (best effort; the store is the truth)."""
        try:
            self.instance.add_run_tags(self.run.run_id, {TAG_PIPELINE: str(self.own.pipeline_id)})
        except Exception as exc:  # noqa: BLE001
            self._info(f"recovery-ext: could not tag run {self.run.run_id}: {redact(exc)}")

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
        return outcome

    def _finish(self, failures: list[Any], error: BaseException | None, interrupted: bool) -> str:
        own = self.own
        current = self.instance.get_run_by_id(self.run.run_id)
        if current is not None and current.status in CANCEL_STATUSES:
            self.store.cancel_run(own, f"run {own.owner} was canceled by its user")
            return f"pipeline {own.pipeline_id} canceled with its run"
        if self.lease is not None and self.lease.lost is not None:
            raise self.lease.lost
        if interrupted:
            return (f"run interrupted without a cancel request; pipeline {own.pipeline_id} is left to recovery")
        if error is not None and _crashed_children(error):
            # The multiprocess executor raises once a step process died (kill -9, OOM): a crash,
            # not a verdict on the pipeline, so it is left to the node heartbeat and the orphan sensor.
            return (f"step process(es) died ({_crashed_children(error)}); pipeline {own.pipeline_id} "
                    "is left to recovery")
        if error is not None:
            self.store.fail_run(own, f"{type(error).__name__}: {error}")
            return f"pipeline {own.pipeline_id} failed: the executor raised {type(error).__name__}"
        if failures:
            crashed = [f.step_key for f in failures if _is_crash(f)]
            running = [n.name for n in self.store.list_nodes(own.pipeline_id) if n.status == "running"]
            if crashed or running:
                return (f"step process(es) {', '.join(crashed or running)} died; pipeline {own.pipeline_id} "
                        "is left to recovery")
            self.store.fail_run(own, _failure_message(failures[0]))
            return f"pipeline {own.pipeline_id} failed: {_failure_message(failures[0])}"
        skipped = self.store.complete_run(own)
        return (f"pipeline {own.pipeline_id} completed" +
                (f"; not executed by this run, recorded as skipped: {', '.join(skipped)}" if skipped else ""))

    def _already_ended(self, exc: OwnershipLost) -> str:
        try:
            current = self.store.get_pipeline(self.own.pipeline_id)
        except StoreError:
            return f"pipeline {self.own.pipeline_id}: ownership lost ({exc.owner}); nothing written"
        if current.owner == self.own.owner and current.epoch == self.own.epoch:
            return f"pipeline {current.id} already {current.status}"
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

    @property
    def retries(self):
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator[Any]:
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
                yield event
        except (KeyboardInterrupt, DagsterExecutionInterruptedError, GeneratorExit):
            interrupted = True
            raise
        except Exception as exc:
            error = exc
            raise
        finally:
            scope.finish(failures=failures, error=error, interrupted=interrupted)


    def _events(self, scope: RunScope, plan_context, execution_plan) -> Iterator[Any]:
        """Replay the finished nodes here, then hand what is left to the inner executor."""
        split = split_plan(scope.job_def, execution_plan, scope.store, scope.own.pipeline_id,
                           carried_op_selection(plan_context.dagster_run))
        if split is None or not split.changes_plan:
            yield from self.inner.execute(plan_context, execution_plan)
            return
        if split.unselected:
            scope._info(f"recovery-ext: resuming the op selection of the first run; not run: {', '.join(split.unselected)}")
        if split.left_out:
            scope._info(f"recovery-ext: finished in an earlier run, not run again: {', '.join(split.left_out)}")
        if split.replay:
            scope._info(f"recovery-ext: replaying {len(split.replay)} finished node(s) in the run worker: "
                        f"{', '.join(split.replay)}")
            failed = False
            for event in replay_events(plan_context, execution_plan, split.replay, scope.own.pipeline_id):
                failed = failed or event.is_step_failure
                yield event
            if failed:
                return
        if split.rest:
            context, subset = subset_context(plan_context, execution_plan, split.rest, [*split.replay, *split.ready])
            yield from self.inner.execute(context, subset)


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

    def copy_for_configured(self, name, description, config_schema):
        return RecoveryExecutorDefinition(self.inner, self.resource_key, name=name, config_schema=config_schema,
                                          description=description or self.description)


def with_recovery(executor_def: ExecutorDefinition = multiprocess_executor, *,
                  resource_key: str = "recovery") -> RecoveryExecutorDefinition:
    """Wrap any executor so the run worker keeps its pipeline alive from run start to run end."""
    if isinstance(executor_def, RecoveryExecutorDefinition):
        return executor_def
    return RecoveryExecutorDefinition(executor_def, resource_key)


def recoverable_job(fn: Callable | None = None, *, executor_def: ExecutorDefinition = multiprocess_executor,
                    resource_key: str = "recovery", **job_kwargs: Any):
    """``@job`` whose executor (multiprocess by default) is wrapped with :func:`with_recovery`."""
    def decorate(body: Callable) -> JobDefinition:
        return job(executor_def=with_recovery(executor_def, resource_key=resource_key), **job_kwargs)(body)

    return decorate(fn) if fn is not None else decorate


@contextmanager
def _in_process_scope(job_def: JobDefinition, run_id: str, run_config: Mapping[str, Any], tags: Mapping[str, str],
                      instance: DagsterInstance, resource: RecoveryResource):
    run = DagsterRun(job_name=job_def.name, run_id=run_id, run_config=dict(run_config), tags=dict(tags))
    scope = RunScope(resource, run, job_def, instance)
    scope.start()
    yield scope


def execute_in_process(job_def: JobDefinition, *, run_config: Mapping[str, Any] | None = None,
                       instance: DagsterInstance | None = None, resources: Mapping[str, Any] | None = None,
                       tags: Mapping[str, str] | None = None, raise_on_error: bool = True,
                       resource_key: str = "recovery", **kwargs: Any):
    """``job_def.execute_in_process`` with run-level liveness (Dagster swaps in its own executor there).

    The calling process is the run worker: it owns and heartbeats the pipeline around the run
    and applies the same lifecycle as :func:`with_recovery` when the run ends.
    """
    run_config = dict(run_config or {})
    tags = dict(tags or {})
    run_id = make_new_run_id()
    owned_instance = instance is None
    instance = instance or DagsterInstance.ephemeral()
    try:
        resource = resolve_resource(job_def, run_config, instance, resource_key,
                                    resource_def=(resources or {}).get(resource_key))
        with _in_process_scope(job_def, run_id, run_config, tags, instance, resource) as scope:
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
