"""The one place recovery-ext reaches into Dagster beyond its public API.

Tested with Dagster 1.12.22 and 1.13.27 (``pyproject.toml`` declares the range). Every import from a
private ``dagster._`` module, or of an integration's private name (dagster-celery's), lives here,
one name a line with what it is for; everything Dagster exports publicly (``Executor``,
``DagsterRun``, ``DagsterEvent``, ``DagsterExecutionInterruptedError``, ...) is imported from
``dagster`` where it is used. ``tests/unit/test_compat.py`` keeps it that way.

What differs between the releases in the range is handled here, so the rest of the library is
written once; prefer code that suits every release, then feature detection, never a version check:

- how Dagster reads a compute function's parameter *types* (:func:`advertise_signature`).

All the private names below exist with the same signatures in 1.12.22 and 1.13.27. They serve the
resume replay (``replay.py``: finished steps are replayed in the run worker instead of re-run) and
the executor wrapper (``executor.py``), and the recovery state shown on a run (``run_state.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# The payload of an engine event: the metadata of the recovery state events shown on a run (run_state.py).
from dagster._core.events import EngineEventData
# Runs a plan's steps inside an execution context and yields its events (replayed steps' run).
from dagster._core.execution.api import ExecuteRunWithPlanIterable
# The per-run execution context a replayed step's context is derived from (type only).
from dagster._core.execution.context.system import PlanExecutionContext
# The orchestration context an executor receives; rebuilt around a subset plan for the rest of a resume.
from dagster._core.execution.context.system import PlanOrchestrationContext
# Creates the execution context (resources, IO managers) in which replayed steps store their outputs.
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
# Checks a replayed step's Output against its output definition, as a real step's body output is.
from dagster._core.execution.plan.execute_step import _step_output_error_checked_user_event_sequence
# Type-checks a replayed output and stores it through the step's IO manager (emits HANDLED_OUTPUT).
from dagster._core.execution.plan.execute_step import _type_check_and_store_output
# The payload of a replayed step's STEP_FAILURE event.
from dagster._core.execution.plan.objects import StepFailureData
# The payload of a replayed step's STEP_SUCCESS event (duration).
from dagster._core.execution.plan.objects import StepSuccessData
# A step output's identity, to mark the outputs of replayed or kept steps ready in a subset plan.
from dagster._core.execution.plan.outputs import StepOutputHandle
# A run's execution plan: split into replayed steps and the subset the wrapped executor runs.
from dagster._core.execution.plan.plan import ExecutionPlan
# A plan step without dynamic outputs; plans with any other kind of step are not split.
from dagster._core.execution.plan.step import ExecutionStep
# The resources the replay's IO managers need, transitively (only those are initialized).
from dagster._core.execution.resources_init import get_transitive_required_resource_keys
# Dagster's resource initialization, restricted to those keys for the replay context.
from dagster._core.execution.resources_init import resource_initialization_manager
# A run config resolved against a job, which building a subset plan needs.
from dagster._core.system_config.objects import ResolvedRunConfig
# A new run's id, in Dagster's own format (the in-process runner creates its run itself).
from dagster._core.utils import make_new_run_id
# The error info of a replayed step that failed, as Dagster records a step error.
from dagster._utils.error import serializable_error_info_from_exc_info

__all__ = [
    "EngineEventData",
    "ExecuteRunWithPlanIterable",
    "ExecutionPlan",
    "ExecutionStep",
    "PlanExecutionContext",
    "PlanExecutionContextManager",
    "PlanOrchestrationContext",
    "ResolvedRunConfig",
    "StepFailureData",
    "StepOutputHandle",
    "StepSuccessData",
    "_step_output_error_checked_user_event_sequence",
    "_type_check_and_store_output",
    "advertise_signature",
    "celery_submit_task",
    "get_transitive_required_resource_keys",
    "make_new_run_id",
    "resource_initialization_manager",
    "serializable_error_info_from_exc_info",
]


def advertise_signature(fn: Callable[..., Any], signature: inspect.Signature) -> Callable[..., Any]:
    """Make Dagster infer the ins, config, resources and output type of ``fn`` from ``signature``.

    Every release reads parameter *names* through ``inspect.signature``, which honours
    ``__signature__``. The *types* differ: 1.13 reads them from an explicit ``__signature__``, 1.12
    from ``typing.get_type_hints(fn)``, i.e. ``fn.__annotations__`` (without them a typed resource
    parameter is taken for an input that "has no way of being resolved"). Setting both, to the same
    already-resolved annotations, gives every release one signature; no version check is needed.
    """
    fn.__signature__ = signature  # type: ignore[attr-defined]
    annotations = {name: p.annotation for name, p in signature.parameters.items()
                   if p.annotation is not inspect.Parameter.empty}
    if signature.return_annotation is not inspect.Signature.empty:
        annotations["return"] = signature.return_annotation
    fn.__annotations__ = annotations
    return fn


def celery_submit_task() -> Callable[..., Any]:
    """dagster-celery's task submission, which the Celery fence wraps to keep each task's result.

    Imported on use: dagster-celery is an optional extra (the ``celery`` one), and its release moves with
    Dagster's (0.28.22 with 1.12.22, 0.29.27 with 1.13.27; the same signature in both).
    """
    # Submits one step as a Celery task and returns its AsyncResult (private: dagster-celery exports no submitter).
    from dagster_celery.executor import _submit_task

    return _submit_task
