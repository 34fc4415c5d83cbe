"""A resume runs only what is left: finished nodes are replayed in the run worker, not re-executed.

When a run owns a pipeline whose nodes already finished (a resume run, a UI re-execution that
took the pipeline over), :func:`split_plan` splits the execution plan in two:

- the steps of finished recoverable nodes are **replayed** in the run worker by
  :func:`replay_events`: no step process, no input loading, no op body. Each step emits the
  usual events (start, output, handled output, success) and stores its recorded output
  (``rx_nodes.output``) through the step's own IO manager under this run's id, so downstream
  steps load it exactly as if it had run here. Its output metadata says
  "skipped: completed in run X", as the op itself would;
- the steps of finished recoverable **assets** are neither replayed nor run: their IO manager
  already holds their value (keyed by asset and partition, not by run), so downstream steps load
  it from there, and the asset records no second materialization;
- every other step (unfinished nodes, plain ops, which have no node row and run again) goes to
  the wrapped executor as a subset plan whose known state marks the replayed and kept outputs ready.

A run that carries the op selection of the run it resumes (tag ``recovery/op_selection``, a
sensor's ``RunRequest`` cannot select ops) is restricted to the selected ops here.

Plans with dynamic outputs (fan-out) are not split: every step goes to the wrapped executor and
finished nodes skip themselves inside their step, as before.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterEvent, DagsterRun, JobDefinition, Output, StepExecutionContext

from recovery_ext._dagster.compat import (
    ExecuteRunWithPlanIterable,
    ExecutionPlan,
    ExecutionStep,
    PlanExecutionContext,
    PlanExecutionContextManager,
    PlanOrchestrationContext,
    ResolvedRunConfig,
    StepFailureData,
    StepOutputHandle,
    StepSuccessData,
    _step_output_error_checked_user_event_sequence,
    _type_check_and_store_output,
    get_transitive_required_resource_keys,
    resource_initialization_manager,
    serializable_error_info_from_exc_info,
)

from recovery_ext._errors import UnresumableSelection
from recovery_ext._store.models import Node
from recovery_ext._dagster.tags import TAG_NODE, TAG_OP_SELECTION
from recovery_ext._store.statuses import NodeStatus
from recovery_ext._store.interfaces import OpStore

# Statuses whose recorded output is what the op would return; a `skipped` node (a branch not
# taken) runs its step as before.
REPLAYED_STATUSES = (NodeStatus.COMPLETED, NodeStatus.DEGRADED)


def skipped_metadata(node: Node, pipeline_id: int) -> dict[str, Any]:
    """The output metadata of a node that a previous run finished (replayed or skipped in its step)."""
    return {"recovery": f"skipped: {node.status} in run {node.run_id}", "skipped": True,
            "pipeline_id": pipeline_id, "attempts": node.attempts}


def carried_op_selection(run: DagsterRun) -> list[str] | None:
    """The op names of the run this one resumes, when it was op-selected."""
    raw = run.tags.get(TAG_OP_SELECTION)
    if not raw or run.resolved_op_selection:
        return None
    try:
        names = json.loads(raw)
    except ValueError as exc:
        raise UnresumableSelection(f"tag {TAG_OP_SELECTION} is not a JSON list of op names: {raw[:200]!r}") from exc
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UnresumableSelection(f"tag {TAG_OP_SELECTION} is not a JSON list of op names: {raw[:200]!r}")
    return names


@dataclass
class Split:
    """How a run's plan is executed: replayed steps here, the rest by the wrapped executor."""

    replay: dict[str, Node] = field(default_factory=dict)   # step key -> its finished node
    rest: list[str] = field(default_factory=list)           # step keys for the wrapped executor
    unselected: list[str] = field(default_factory=list)     # step keys outside the carried op selection
    # finished steps not run at all: no remaining step needs their recorded output, or they are
    # assets, whose value their IO manager already holds under the asset key (replaying the
    # node's record would overwrite it, and record a second materialization)
    left_out: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)          # left-out asset steps a remaining step reads

    @property
    def changes_plan(self) -> bool:
        return bool(self.replay or self.unselected or self.left_out)


def _selected(step: ExecutionStep, selection: set[str]) -> bool:
    path = str(step.node_handle).split(".")
    return any(".".join(path[: i + 1]) in selection for i in range(len(path)))


def _materializes(job_def: JobDefinition, step: ExecutionStep) -> bool:
    layer = job_def.asset_layer
    return any(layer.get_asset_key_for_node_output(step.node_handle, output.name) is not None
               for output in step.step_outputs)


def _plain_step(plan: ExecutionPlan, key: str) -> ExecutionStep:
    step = plan.get_step_by_key(key)
    assert isinstance(step, ExecutionStep)  # split_plan splits only plans whose steps all are
    return step


def split_plan(job_def: JobDefinition, plan: ExecutionPlan, store: OpStore, pipeline_id: int,
               selection: list[str] | None) -> Split | None:
    """Which steps to replay and which to execute; ``None`` when the plan runs unchanged (dynamic outputs)."""
    if any(not isinstance(step, ExecutionStep) for step in plan.steps) or any(
            "[" in key for key in plan.step_keys_to_execute):
        if selection is not None:
            raise UnresumableSelection("a resume of an op-selected run of a job with dynamic outputs is not "
                                       "supported; re-execute the original run from the UI")
        return None
    finished = {n.name: n for n in store.pipelines.list_nodes(pipeline_id) if n.status in REPLAYED_STATUSES}
    chosen = set(selection or ())
    split = Split()
    for step in plan.get_steps_to_execute_in_topo_order():
        if selection is not None and not _selected(step, chosen):
            split.unselected.append(step.key)
            continue
        definition = job_def.get_node(step.node_handle).definition
        node = finished.get(definition.name) if (definition.tags or {}).get(TAG_NODE) == "true" else None
        if node is not None and _materializes(job_def, step):
            split.left_out.append(step.key)
        elif node is not None and len(step.step_outputs) == 1:
            split.replay[step.key] = node
        else:
            split.rest.append(step.key)
    # Only the finished steps whose output a remaining step reads are replayed: the rest cost nothing.
    needed = set().union(*(_plain_step(plan, key).get_execution_dependency_keys() for key in split.rest))
    for key in [k for k in split.replay if k not in needed]:
        del split.replay[key]
        split.left_out.append(key)
    split.ready = [key for key in split.left_out if key in needed]
    if split.unselected:
        kept = set(split.replay) | set(split.rest) | set(split.left_out)
        for key in kept:
            missing = _plain_step(plan, key).get_execution_dependency_keys() - kept
            if missing:
                raise UnresumableSelection(
                    f"the resumed run selected op(s) {sorted(chosen)}, but step {key} takes input from "
                    f"unselected step(s) {sorted(missing)} in job {job_def.name!r}; re-execute the original "
                    "run from the UI to resume it")
    return split


def subset_context(plan_context: PlanOrchestrationContext, plan: ExecutionPlan, step_keys: list[str],
                   ready: Iterable[str]) -> tuple[PlanOrchestrationContext, ExecutionPlan]:
    """The orchestration context and plan of ``step_keys`` with the outputs of the ``ready`` steps marked ready."""
    job_def = plan_context.job.get_definition()
    subset = plan.build_subset_plan(step_keys, job_def, _resolved_run_config(plan_context, job_def))
    outputs = {StepOutputHandle(key, output.name) for key in ready for output in plan.get_step_by_key(key).step_outputs}
    known = subset.known_state._replace(ready_outputs=set(subset.known_state.ready_outputs) | outputs)
    subset = subset._replace(known_state=known)
    context = PlanOrchestrationContext(
        plan_data=plan_context.plan_data._replace(execution_plan=subset), log_manager=plan_context.log,
        executor=plan_context.executor, output_capture=plan_context.output_capture,
        resume_from_failure=plan_context.resume_from_failure,
    )
    return context, subset


def _resolved_run_config(plan_context: PlanOrchestrationContext, job_def: JobDefinition) -> ResolvedRunConfig:
    return ResolvedRunConfig.build(job_def, plan_context.run_config)


def replay_events(plan_context: PlanOrchestrationContext, plan: ExecutionPlan, replay: Mapping[str, Node],
                  pipeline_id: int) -> Iterator[DagsterEvent]:
    """Replay the finished steps in this process (resources are initialized once for all of them)."""
    context, subset = subset_context(plan_context, plan, list(replay), ())

    def iterate(job_context: PlanExecutionContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        for step in execution_plan.get_steps_to_execute_in_topo_order():
            step_context = job_context.for_step(step, execution_plan.known_state)
            failed = False
            for event in _replay_step(step_context, replay[step.key], pipeline_id):
                failed = failed or event.is_step_failure
                yield event
            if failed:
                return  # nothing downstream of a step that could not be replayed runs

    yield from ExecuteRunWithPlanIterable(
        execution_plan=subset,
        iterator=iterate,
        execution_context_manager=PlanExecutionContextManager(
            job=context.job, retry_mode=context.retry_mode, execution_plan=subset, run_config=context.run_config,
            dagster_run=context.dagster_run, instance=context.instance, raise_on_error=False,
            output_capture=context.output_capture, step_dependency_config=plan_context.executor.step_dependency_config,
            scoped_resources_builder_cm=_initializing_only(_output_resource_keys(plan_context, subset)),
        ),
    )


def _output_resource_keys(plan_context: PlanOrchestrationContext, plan: ExecutionPlan) -> frozenset[str]:
    """The resources a replay uses: the IO managers that store the replayed outputs, the resources their
    types check with, and what those need. Not the ops' own resources: no op body runs here."""
    job_def = plan_context.job.get_definition()
    keys: set[str] = set()
    for step in plan.get_steps_to_execute_in_topo_order():
        definition = job_def.get_node(step.node_handle).definition
        for output in step.step_outputs:
            output_def = definition.output_def_named(output.name)
            keys.add(output_def.io_manager_key)
            keys.update(output_def.dagster_type.required_resource_keys)
    return frozenset(get_transitive_required_resource_keys(keys, job_def.resource_defs))


def _initializing_only(keys: frozenset[str]) -> Callable[..., Any]:
    """Dagster's resource initialization for the replay context, limited to ``keys``.

    Initializing every resource the replayed steps declare (a ConfigurableResource is validated and
    built anew each time) was most of what a resume cost beyond a fresh run of its remaining ops.
    The run's own execution context, for the steps that do run, still initializes all of theirs and
    records those events; this one records none of its own.
    """
    def manager(**kwargs: Any) -> Any:
        return resource_initialization_manager(**{**kwargs, "resource_keys_to_init": keys,
                                                  "emit_persistent_events": False})

    return manager


def _replay_step(step_context: StepExecutionContext, node: Node, pipeline_id: int) -> Iterator[DagsterEvent]:
    yield DagsterEvent.step_start_event(step_context)
    started = time.perf_counter()
    try:
        (output_def,) = step_context.op_def.output_defs
        produced = Output(node.output, output_def.name, metadata=skipped_metadata(node, pipeline_id))
        for output in _step_output_error_checked_user_event_sequence(step_context, iter([produced])):
            if isinstance(output, Output):  # it checks the one Output it is given and yields it back
                yield from _type_check_and_store_output(step_context, output)
    except Exception:  # noqa: BLE001 - reported as this step's failure, like any step error
        error = serializable_error_info_from_exc_info(sys.exc_info())
        # Dagster's event payloads are NamedTuples with an untyped __new__
        failure = StepFailureData(error=error, user_failure_data=None)  # type: ignore[no-untyped-call]
        yield DagsterEvent.step_failure_event(step_context, failure)
        return
    duration_ms = (time.perf_counter() - started) * 1000
    success = StepSuccessData(duration_ms=duration_ms)  # type: ignore[no-untyped-call]
    yield DagsterEvent.step_success_event(step_context, success)
