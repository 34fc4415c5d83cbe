"""Executor fences: how each kind of executor runs its steps under the run's lease.

The run worker's :class:`~recovery_ext._dagster.executor.RecoveringExecutor` hands the steps to the
executor it wraps. Most executors need nothing more: the run scope heartbeats the pipeline and each
node's writes are fenced by its epoch. An executor whose own loop can wait for ever on a step whose
host died (dagster-celery polls a task that never becomes ready) needs its loop fenced: once the
pipeline is reclaimed from the run, its steps are stopped and the loop ends.

A fence is one registered class: Celery's is the first entry; a Kubernetes or Docker ``StepHandler``
wrapper would be one more, registered with :func:`register_executor_fence`, with no change here.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from dagster import DagsterEvent, Executor

from recovery_ext._dagster.compat import ExecutionPlan, PlanOrchestrationContext


class Lease(Protocol):
    """What a fence sees of the run's lease on its pipeline."""

    def superseded(self) -> bool:
        """Whether the pipeline was reclaimed from this run (its steps must stop)."""
        ...


@runtime_checkable
class ExecutorFence(Protocol):
    """Runs one kind of executor's steps so that a superseded run stops them and ends."""

    def handles(self, executor: Executor) -> bool:
        """Whether this fence runs ``executor`` (checked in registration order; the first that handles it wins)."""
        ...

    def execute(self, executor: Executor, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan,
                scope: Lease) -> Iterator[DagsterEvent]:
        """The executor's events for ``execution_plan``; ``scope.superseded()`` says when the run lost its lease."""
        ...


# The built-in fences, loaded on first use by name: each imports this module for its types.
_BUILTINS = [("recovery_ext._dagster.celery_fence", "CeleryFence")]
_lock = threading.Lock()
_fences: list[ExecutorFence] = []
_builtins_loaded = False


def register_executor_fence(fence: ExecutorFence) -> None:
    """Add a fence, consulted before the built-in ones (so a user's fence can replace Celery's)."""
    if not isinstance(fence, ExecutorFence):
        raise TypeError(f"{fence!r} is not an ExecutorFence: it needs handles() and execute()")
    with _lock:
        _fences.insert(0, fence)


def _load_builtins() -> None:
    global _builtins_loaded
    with _lock:
        if _builtins_loaded:
            return
        for module, name in _BUILTINS:
            _fences.append(getattr(importlib.import_module(module), name)())
        _builtins_loaded = True


def fence_for(executor: Executor) -> ExecutorFence | None:
    """The fence that runs ``executor``, or None: it runs as it is."""
    _load_builtins()
    with _lock:
        fences = list(_fences)
    return next((fence for fence in fences if fence.handles(executor)), None)


def execute_steps(executor: Executor, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan,
                  scope: Lease) -> Iterator[DagsterEvent]:
    """The wrapped executor's events, through its fence where it has one."""
    fence = fence_for(executor)
    if fence is None:
        yield from executor.execute(plan_context, execution_plan)
    else:
        yield from fence.execute(executor, plan_context, execution_plan, scope)
