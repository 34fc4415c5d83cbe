"""A node's guarded provider calls: the outage guard bound to the node's pipeline."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dagster import Failure, RetryRequested

from recovery_ext._classify.classifier import ClassifiedError, retry_after_of
from recovery_ext._errors import OwnershipLost
from recovery_ext._providers.budget import RateBudget
from recovery_ext._store.models import ProviderLimits
from recovery_ext._providers.guard import ProviderGuard, StorePause, cut_to_budget
from recovery_ext._providers.spend import SpendCap
from recovery_ext._classify.redaction import redact
from recovery_ext._classify.retry import RetryPolicy, wait_jittered_exponential
from recovery_ext._dagster.errors import to_failure
from recovery_ext._dagster.context import NodeContext, store_of
from recovery_ext._dagster.body import NodeRun
from recovery_ext._dagster.run_state import RunStateReporter
from recovery_ext._store.models import WaitKind
from recovery_ext._store.models import Ownership
from recovery_ext._store.interfaces import GuardStore, OpStore


class RunVisiblePause(StorePause):
    """A pause shown on the pipeline row and on the Dagster run (tag ``recovery/state`` and engine events)."""

    def __init__(self, store: GuardStore, own: Ownership, node: str, reporter: RunStateReporter,
                 ctx: NodeContext | None = None) -> None:
        super().__init__(store, own, node)
        self.reporter = reporter
        self.ctx = ctx  # the node's try: a retry's outage clock goes on until it finishes an item

    def elapsed(self) -> float | None:
        """The pipeline's outage clock, once a retried node that finished an item since its pause has ended it."""
        if self.ctx is not None:
            self.ctx.end_outage_if_progressed()
        return super().elapsed()

    def answer_keeps_clock(self) -> bool:
        """A retried node's answer after a pause is no end of its outage until the try finished an item: else a
        try that pauses, gets an answer and fails again would start its outage over each time, for ever."""
        return self.ctx is not None and self.ctx.outage_goes_on()

    def begin(self, seconds: float, reason: str) -> None:
        super().begin(seconds, reason)
        self.reporter.waiting(seconds, reason, until=self.until)

    def retrying(self) -> None:
        was_paused = self.paused
        super().retrying()
        if was_paused:
            self.reporter.going_on("the pause is over, asking the provider again")

    def end(self, *, outage_over: bool) -> None:
        was_paused = self.paused
        super().end(outage_over=outage_over)
        if was_paused:
            self.reporter.going_on("the provider answered" if outage_over else "the outage budget is spent")


def node_spend_cap(ctx: NodeContext, prices: Any = None) -> SpendCap:
    """The spend caps of this node's pipeline: the ``recovery`` resource's ``spend_cap_*`` settings, and any cap an
    operator set on the pipeline or its deployment (``recovery-ext spend-cap set``), looked up at the node's first
    call, not here: this runs where the call is planned, on an event loop for an async client. A pause at a cap is
    shown on the pipeline and on the Dagster run."""
    caps = ctx.resource.spend_caps()
    store, own = store_of(ctx), ctx.ownership
    reporter = RunStateReporter(ctx.context, ctx.node_name)
    watchdog = ctx.watchdog

    def show(seconds: float, reason: str, first: bool) -> None:
        until = store.providers.show_wait(own, seconds, reason, kind=WaitKind.SPEND_CAP, node=ctx.node_name,
                                          first=first)
        if until is not None and first:
            reporter.waiting(seconds, reason, until=until, kind=WaitKind.SPEND_CAP)

    def end() -> None:
        if store.providers.clear_wait(own, kind=WaitKind.SPEND_CAP, node=ctx.node_name):
            reporter.going_on("the spend cap has room again")

    return SpendCap(store, own, caps, prices=prices, show_wait=show, end_wait=end,
                    stop=watchdog.superseded if watchdog is not None else None, check=ctx.check_calls,
                    log=ctx.log.warning)


def provider_guard(ctx: NodeContext, endpoint: str, policy: RetryPolicy, *,
                   sleep: Callable[[float], None] | None = None, limits: ProviderLimits | None = None,
                   journal: bool = True, prices: Any = None) -> ProviderGuard:
    """Calls to ``endpoint`` from this node: the shared breaker, Retry-After, pauses shown on the pipeline,
    and with ``limits`` the endpoint's request and token budget shared by every process. Each call first
    reserves its estimated tokens under the pipeline's spend caps, if the ``recovery`` resource sets any
    (``prices``, a :class:`Prices`, turns them into the most they can cost, for a cap in money).

    A pause or a budget wait sleeps in the node while its heartbeat goes on; losing ownership wakes it at
    once. No attempt starts once this worker is superseded or its run worker died. With ``journal`` (the
    default) each answer is kept before the node sees it and a resume's same call is answered from it.
    """
    watchdog = ctx.watchdog
    store, own, who = store_of(ctx), ctx.ownership, f"{ctx.ownership.owner}/{ctx.pipeline_id}/{ctx.node_name}"
    shutdown = watchdog.superseded if watchdog is not None else None
    budget = None
    reporter = RunStateReporter(ctx.context, ctx.node_name)
    if limits is not None and limits.enabled:
        budget = RateBudget(
            store, endpoint, limits, who=who, own=own, stop=shutdown, check=ctx.check_calls, log=ctx.log.info,
            show_wait=lambda seconds, reason: _show_budget_wait(store, own, ctx, reporter, seconds, reason),
            end_wait=lambda: _end_budget_wait(store, own, ctx, reporter))
    return ProviderGuard(
        endpoint, policy=policy, settings=ctx.resource.outage_settings(), store=store,
        pause=RunVisiblePause(store, own, ctx.node_name, RunStateReporter(ctx.context, ctx.node_name), ctx), who=who,
        shutdown=shutdown, sleep=sleep, log=ctx.log.warning, budget=budget, check=ctx.check_calls,
        journal=ctx.journal if journal else None, spend=node_spend_cap(ctx, prices),
    )


def _show_budget_wait(store: OpStore, own: Ownership, ctx: NodeContext, reporter: RunStateReporter, seconds: float,
                      reason: str) -> None:
    """A wait for the provider's budget, shown on the pipeline row and on the Dagster run."""
    if store.providers.show_budget_wait(own, seconds, reason, node=ctx.node_name):
        reporter.waiting(seconds, f"rate budget: {reason}")


def _end_budget_wait(store: OpStore, own: Ownership, ctx: NodeContext, reporter: RunStateReporter) -> None:
    if store.providers.clear_budget_wait(own, node=ctx.node_name):
        reporter.going_on("the provider's rate budget has room again")


def node_outage_pause(run: NodeRun, own: Ownership, err: ClassifiedError,
                      repeated: int) -> tuple[RetryRequested | Failure, ClassifiedError]:
    """A node kept failing transiently: pause the pipeline (shown as waiting) and retry the node after a
    jittered exponential cool-down, or give up once the outage outlasts the budget.

    The pause is Dagster's own retry wait; the run keeps the pipeline alive meanwhile. The outage clock
    is ``waiting_since`` on the database clock, so it counts across retries and resumes alike.
    """
    context, store, op_name = run.context, run.store, run.name
    settings = run.resource.outage_settings()
    elapsed = store.providers.waiting_seconds(own.pipeline_id) or 0.0
    if elapsed >= settings.budget_seconds:
        err = ClassifiedError(err, category=err.category, status_code=err.status_code, retryable=False,
                              model=err.model, endpoint=err.endpoint,
                              message=f"gave up: {op_name} kept failing ({err.category}) for {elapsed:.1f} s and used "
                                      f"up the outage budget of {settings.budget_seconds:g} s; last error: "
                                      f"{err.detail}")
        return to_failure(err), err
    # Pause k waits pause_initial * 2**(k-1): after pauses of 30, 60, 120 s the outage clock reads 210 s.
    number = 1 + int(math.log2(1 + elapsed / settings.pause_initial))
    delay = wait_jittered_exponential(settings.pause_initial, max_delay=settings.pause_max,
                                      jitter=settings.jitter).delay(number)
    asked = retry_after_of(err)
    if asked is not None:
        delay = max(delay, min(asked, settings.pause_max))
    delay, reason = cut_to_budget(delay, elapsed, settings.budget_seconds,
                                  redact(f"{repeated} {err.category} errors in a row in {op_name}: {err.detail}")[:400])
    try:
        until = store.providers.set_waiting(own, delay, reason, node=op_name)
    except OwnershipLost as lost:
        raise Failure(description=f"superseded by run {lost.owner}; stopped without writing",
                      allow_retries=False) from None
    RunStateReporter(context, op_name).waiting(delay, reason, until=until)
    context.log.warning(f"{op_name}: pipeline {own.pipeline_id} waits {delay:.1f} s (pause {number}): {reason}")
    return RetryRequested(max_retries=context.retry_number + 1, seconds_to_wait=delay), err
