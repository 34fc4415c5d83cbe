"""A Celery run that was superseded stops, instead of waiting for ever on a dead worker.

**A superseded run stops** (:class:`CeleryFence`, the first entry of the executor fence registry).
dagster-celery polls only ``result.ready()``: a task whose worker host died never becomes ready, so
its run would wait for ever (no step health check upstream). Here the run worker watches its own
pipeline lease: once the pipeline was reclaimed (a node's heartbeat expired, the run was reclaimed
while cut off, ...), it revokes every task it submitted (``terminate=True``: a live worker kills the
step's process), submits nothing more, treats the tasks still out as revoked, marks the run FAILURE
with a message naming the resume run (unless the orphan sensor already did), and ends as an
interrupted run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dagster import DagsterEvent, Executor

from recovery_ext._dagster.compat import ExecutionPlan, PlanOrchestrationContext, dagster_celery_internals
from recovery_ext._dagster.fences import Lease


class _Fence:
    """What the run's tasks see of its pipeline lease: superseded once the lease is lost."""

    def __init__(self, scope: Lease) -> None:
        self.scope = scope
        self.results: list[Any] = []
        self.revoked = False

    def superseded(self) -> bool:
        if not self.scope.superseded():
            return False
        if not self.revoked:
            self.revoked = True
            for result in self.results:
                with contextlib.suppress(Exception):  # the broker may be away; the tasks are fenced anyway
                    result.revoke(terminate=True)
        return True


class _FencedResult:
    """An ``AsyncResult`` that reads as revoked once the run was superseded.

    dagster-celery polls ``ready()`` once a second; a task whose worker died is never ready, so
    without this its run would wait for ever.
    """

    def __init__(self, result: Any, fence: _Fence) -> None:
        self.result = result
        self.fence = fence

    def ready(self) -> bool:
        return self.fence.superseded() or self.result.ready()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        from celery.exceptions import TaskRevokedError

        if self.fence.superseded() and not self.result.ready():
            raise TaskRevokedError(f"task {self.result.id}: its run was superseded by a recovery resume")
        # Under the CeleryRunLauncher the run worker is itself a Celery task, and Celery refuses a
        # plain get() there ("Never call result.get() within a task!"); the result is ready here.
        kwargs.setdefault("disable_sync_subtasks", False)
        return self.result.get(*args, **kwargs)

    def revoke(self, *args: Any, **kwargs: Any) -> Any:
        return self.result.revoke(*args, **kwargs)


class _NotSubmitted:
    """A step the superseded run did not submit: it reads as revoked at once."""

    id = None

    def ready(self) -> bool:
        return True

    def get(self, *args: Any, **kwargs: Any) -> Any:
        from celery.exceptions import TaskRevokedError

        raise TaskRevokedError("not submitted: the run was superseded by a recovery resume")

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        return None


class CeleryFence:
    """dagster-celery's own execution loop and task submission, with results fenced by the run's lease."""

    def handles(self, executor: Executor) -> bool:
        try:
            celery = dagster_celery_internals()
        except ImportError:  # the celery extra is not installed: no executor can be a CeleryExecutor
            return False
        return isinstance(executor, celery.executor_class)

    def execute(self, executor: Executor, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan,
                scope: Lease) -> Iterator[DagsterEvent]:
        celery = dagster_celery_internals()
        submit_task = celery.submit_task
        fence = _Fence(scope)

        def submit(app: Any, context: Any, step: Any, queue: str, priority: int, known_state: Any) -> Any:
            if fence.superseded():
                return _NotSubmitted()
            result = submit_task(app, context, step, queue, priority, known_state)
            fence.results.append(result)
            return _FencedResult(result, fence)

        yield from celery.execution_loop(plan_context, execution_plan, step_execution_fn=submit)
