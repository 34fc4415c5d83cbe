"""A node's guarded provider calls: the outage guard bound to the node's pipeline (issue 10)."""

from __future__ import annotations

from collections.abc import Callable

import math

from dagster import Failure, RetryRequested

from ..classify import ClassifiedError, retry_after_of
from ..errors import OwnershipLost
from ..outage import ProviderGuard, StorePause
from ..redaction import redact
from ..retry import RetryPolicy, wait_jittered_exponential
from .errors import to_failure
from .recoverable import NodeContext


def provider_guard(ctx: NodeContext, endpoint: str, policy: RetryPolicy, *,
                   sleep: Callable[[float], None] | None = None) -> ProviderGuard:
    """Calls to ``endpoint`` from this node: the shared breaker, Retry-After, pauses shown on the pipeline.

    A pause sleeps in the node while its watchdog keeps heartbeating; losing ownership wakes it at once.
    """
    watchdog = ctx.watchdog
    return ProviderGuard(
        endpoint, policy=policy, settings=ctx.resource.outage_settings(), store=ctx._store,
        pause=StorePause(ctx._store, ctx.ownership, ctx.node_name),
        who=f"{ctx.ownership.owner}/{ctx.pipeline_id}/{ctx.node_name}",
        shutdown=watchdog.superseded if watchdog is not None else None, sleep=sleep,
        log=ctx.log.warning,
    )


def node_outage_pause(context, store, resource, own, op_name: str, err: ClassifiedError,
                      repeated: int) -> tuple[RetryRequested | Failure, ClassifiedError]:
    """A node kept failing transiently: pause the pipeline (shown as waiting) and retry the node after a
    jittered exponential cool-down, or give up once the outage outlasts the budget.

    The pause is Dagster's own retry wait; the run keeps the pipeline alive meanwhile. The outage clock
    is ``waiting_since`` on the database clock, so it counts across retries and resumes alike.
    """
    settings = resource.outage_settings()
    elapsed = store.waiting_seconds(own.pipeline_id) or 0.0
    if elapsed >= settings.budget_seconds:
        err = ClassifiedError(err, category=err.category, status_code=err.status_code, retryable=False,
                              model=err.model, endpoint=err.endpoint,
                              message=f"gave up: {op_name} kept failing ({err.category}) for {elapsed:.1f} s, longer "
                                      f"than the outage budget of {settings.budget_seconds:g} s; last error: "
                                      f"{err.detail}")
        return to_failure(err), err
    # Pause k waits pause_initial * 2**(k-1): after pauses of 30, 60, 120 s the outage clock reads 210 s.
    number = 1 + int(math.log2(1 + elapsed / settings.pause_initial))
    delay = wait_jittered_exponential(settings.pause_initial, max_delay=settings.pause_max,
                                      jitter=settings.jitter).delay(number)
    asked = retry_after_of(err)
    if asked is not None:
        delay = max(delay, min(asked, settings.pause_max))
    reason = redact(f"{repeated} {err.category} errors in a row in {op_name}: {err.detail}")[:400]
    try:
        store.set_waiting(own, delay, reason, node=op_name)
    except OwnershipLost as lost:
        raise Failure(description=f"superseded by run {lost.owner}; stopped without writing",
                      allow_retries=False) from None
    context.log.warning(f"{op_name}: pipeline {own.pipeline_id} waits {delay:.1f} s (pause {number}): {reason}")
    return RetryRequested(max_retries=context.retry_number + 1, seconds_to_wait=delay), err


def waiting_summary(store, *, limit: int = 3) -> str:
    """For the orphan sensor's tick: which pipelines wait on an outage, why, and when they try next."""
    try:
        waiting = store.waiting_pipelines(limit=limit + 1)
    except Exception as exc:  # noqa: BLE001 - the tick reports the store's trouble elsewhere
        return f"; waiting pipelines unknown ({type(exc).__name__})"
    if not waiting:
        return ""
    shown = [f"pipeline {w['id']} next try {w['waiting_until']:%H:%M:%S} UTC ({(w['waiting_reason'] or '')[:80]})"
             for w in waiting[:limit]]
    more = ", and more" if len(waiting) > limit else ""
    return f"; waiting on provider outages: {'; '.join(shown)}{more}"
