"""The outage clock: it runs from a node's first pause until the node completes, so the outage budget gives up on an
overload that persists, answers in between or not; and a call's wait at a spend cap or for rate budget room is no
outage time of its own."""

from __future__ import annotations

import threading
import time

import httpx
from dagster import in_process_executor

from recovery_ext import (ClassifiedError, NodeContext, RecoveryResource, execute_in_process, recoverable_job,
                          recoverable_op)
from recovery_ext._dagster.context import store_of
from recovery_ext._dagster.providers import provider_guard
from recovery_ext._store.models import pipeline_scope


def run(job, url, **settings):
    resource = RecoveryResource(**{"database_url": url, "heartbeat_interval": 0.5, "heartbeat_timeout": 3,
                                   "retry_initial_delay": 0.01, "retry_max_delay": 0.02, **settings})
    return execute_in_process(job, resources={"recovery": resource}, raise_on_error=False)


def busy(message: str = "busy") -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://llm.example/v1/x")
    return httpx.HTTPStatusError(message, request=request, response=httpx.Response(503, request=request))


def failures(result) -> list[str]:
    return [str(e.event_specific_data.error) for e in result.all_events if e.event_type_value == "STEP_FAILURE"]


RETRIES_SEEN: list[int] = []


@recoverable_op
def answers_then_stays_overloaded(ctx: NodeContext) -> int:
    """Each try first gets an answer (sent once, then from the journal), then meets an overload the guard does not
    see (an error event ending a stream after the guarded call returned), for ever."""
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None))
    guard.call(lambda question: {"answer": question}, "first")
    RETRIES_SEEN.append(ctx.context.retry_number)
    if ctx.context.retry_number >= 40:
        return -1  # the test's own stop: the node never gave up
    raise ClassifiedError(category="server_error", retryable=True, status_code=503, message="overloaded")


@recoverable_job(executor_def=in_process_executor)
def stays_overloaded_job():
    answers_then_stays_overloaded()


def test_an_overload_after_an_answer_on_every_try_still_gives_up_at_the_outage_budget(store, db_url):
    """A second review: with the outage clock ended by a node's first answer, a node whose every try got one answer
    (a replay too) before its persistent overload paused and retried for ever, its clock always near 0. The clock
    runs from the node's first pause until the node completes: the outage budget gives up."""
    RETRIES_SEEN.clear()
    result = run(stays_overloaded_job, db_url, max_retries=0, outage_budget_seconds=0.6, outage_pause_initial=0.05,
                 outage_pause_max=0.1)
    assert not result.success and max(RETRIES_SEEN) < 40, RETRIES_SEEN
    assert any("longer than the outage budget" in failure for failure in failures(result)), failures(result)
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "failed"


SPEND_CAP_CALLS: list[float] = []


@recoverable_op
def waits_at_the_cap_between_two_503s(ctx: NodeContext) -> str:
    """One 503, while an operator lowers the pipeline's spend cap to 0 and raises it again after longer than the
    outage budget; then one more 503, and the answer."""
    store, scope = store_of(ctx), pipeline_scope(ctx.pipeline_id)
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)
    held = 1.5 * ctx.resource.outage_budget_seconds

    def ask() -> str:
        SPEND_CAP_CALLS.append(time.monotonic())
        if len(SPEND_CAP_CALLS) == 1:
            store.providers.spend_cap_set(scope, tokens=0)
            threading.Timer(held, lambda: store.providers.spend_cap_set(scope, tokens=10_000)).start()
            raise busy()
        if len(SPEND_CAP_CALLS) == 2:
            raise busy("one more blip after the cap was raised")
        return "answer"

    return guard.metered(10, "m", ask)


@recoverable_job(executor_def=in_process_executor)
def spend_cap_job():
    waits_at_the_cap_between_two_503s()


def test_a_wait_at_the_spend_cap_between_two_503s_is_no_outage_time(store, db_url):
    """Before: a call's own outage time ran from its first failure through its wait at the spend cap, so its next
    single 503 after the operator raised the cap gave up for good (OutageBudgetExceeded, the pipeline failed)."""
    SPEND_CAP_CALLS.clear()
    result = run(spend_cap_job, db_url, outage_budget_seconds=1.0, spend_cap_tokens=1000, spend_cap_poll_seconds=0.1,
                 max_retries=0)
    assert result.success, failures(result)
    assert len(SPEND_CAP_CALLS) == 3 and SPEND_CAP_CALLS[1] - SPEND_CAP_CALLS[0] >= 1.5  # it did wait at the cap
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"
