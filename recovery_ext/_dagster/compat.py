"""The one place recovery-ext reaches into Dagster beyond its public API.

Tested with Dagster 1.12.22 and 1.13.27 (``pyproject.toml`` declares the range). Every import from a
private ``dagster._`` module, and of any name an integration does not export (dagster-celery exports
``celery_executor`` alone), lives here, one name a line with what it is for; everything a package exports
(``dagster``'s public names: ``Executor``, ``DagsterRun``, ``DagsterEvent``, ...; ``dagster_celery.celery_executor``)
is imported from the package where it is used. ``tests/unit/test_compat.py`` keeps it that way, by what
each package exports, not by the spelling of a name.

What differs between the releases in the range is handled here, so the rest of the library is
written once; prefer code that suits every release, then feature detection, never a version check:

- how Dagster reads a compute function's parameter *types* (:func:`advertise_signature`).

All the private names below exist with the same signatures in 1.12.22 and 1.13.27. They serve the
resume replay (``replay.py``: finished steps are replayed in the run worker instead of re-run) and
the executor wrapper (``executor.py``), and the recovery state shown on a run (``run_state.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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
    "DagsterCeleryInternals",
    "ResolvedRunConfig",
    "StepFailureData",
    "StepOutputHandle",
    "StepSuccessData",
    "_step_output_error_checked_user_event_sequence",
    "_type_check_and_store_output",
    "advertise_signature",
    "dagster_celery_internals",
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


@dataclass(frozen=True)
class DagsterCeleryInternals:
    """dagster-celery's names that it does not export (its ``__all__`` is ``celery_executor`` alone)."""

    submit_task: Callable[..., Any]
    executor_class: type
    execution_loop: Callable[..., Iterator[Any]]
    default_config: Mapping[str, Any]
    dict_wrapper: Callable[..., Any]
    make_app: Callable[..., Any]
    create_task: Callable[..., Any]
    create_execute_job_task: Callable[..., Any]
    create_resume_job_task: Callable[..., Any]


def dagster_celery_internals() -> DagsterCeleryInternals:
    """What the Celery fence and a worker's app use of dagster-celery beyond its public executor.

    Imported on use: dagster-celery is an optional extra (the ``celery`` one; ImportError without it), and its
    release moves with Dagster's (0.28.22 with 1.12.22, 0.29.27 with 1.13.27; the same names in both).
    """
    # Submits one step as a Celery task and returns its AsyncResult (the fence wraps it to keep each result).
    from dagster_celery.executor import _submit_task
    # The executor's class: the fence handles a run's executor only when it is dagster-celery's.
    from dagster_celery.executor import CeleryExecutor
    # dagster-celery's own execution loop, which the fence runs with its fenced submitter.
    from dagster_celery.core_execution_loop import core_celery_execution_loop
    # The Celery settings dagster-celery's workers start from; a worker app adds the configured ones.
    from dagster_celery.config import DEFAULT_CONFIG
    # Wraps those settings as the config source dagster-celery's app factory reads.
    from dagster_celery.config import dict_wrapper
    # Builds the Celery app from the broker, backend and config source, as the executor does.
    from dagster_celery.make_app import make_app
    # Registers the step task on a worker's app.
    from dagster_celery.tasks import create_task
    # Registers the run task (a whole run on a worker) on a worker's app.
    from dagster_celery.tasks import create_execute_job_task
    # Registers the resumed-run task on a worker's app.
    from dagster_celery.tasks import create_resume_job_task

    return DagsterCeleryInternals(
        submit_task=_submit_task, executor_class=CeleryExecutor, execution_loop=core_celery_execution_loop,
        default_config=DEFAULT_CONFIG, dict_wrapper=dict_wrapper, make_app=make_app, create_task=create_task,
        create_execute_job_task=create_execute_job_task, create_resume_job_task=create_resume_job_task)

