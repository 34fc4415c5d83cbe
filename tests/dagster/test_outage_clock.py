"""The outage clock runs only while an outage does: a provider's answer to a node retried after its own pause ends
it, and a wait at a spend cap or for rate budget room is no outage time (the outage budget gives up only on what
the provider did)."""

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


HEALTHY_THEN_ONE_503: list[str] = []


@recoverable_op
def pauses_then_answers(ctx: NodeContext) -> int:
    """The provider is down at first (the node pauses: the pipeline's outage clock starts); on the retry it answers
    every call for longer than the outage budget, then one call meets a single 503, answered when asked again."""
    if ctx.context.retry_number == 0:
        raise ClassifiedError(category="server_error", retryable=True, status_code=503, message="provider down")
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)
    budget = ctx.resource.outage_budget_seconds
    started = time.monotonic()
    while time.monotonic() - started < 1.5 * budget:  # a healthy stretch longer than the budget
        guard.call(HEALTHY_THEN_ONE_503.append, "answered")

    def blip() -> str:
        if "503" not in HEALTHY_THEN_ONE_503:
            HEALTHY_THEN_ONE_503.append("503")
            raise busy()
        return "answered after one 503"

    return len(guard.call(blip))


@recoverable_job(executor_def=in_process_executor)
def healthy_stretch_job():
    pauses_then_answers()


def test_a_provider_answering_again_ends_the_outage_clock_a_node_s_pause_started(store, db_url):
    """Before: the node's retry after its outage pause kept the pipeline's outage clock, and only the node's
    completion ended it, so after a healthy stretch as long as the budget one 503 gave up at once ("stayed
    unavailable ... longer than the outage budget"), failing the pipeline. Now the first answer ends the outage."""
    HEALTHY_THEN_ONE_503.clear()
    result = run(healthy_stretch_job, db_url, max_retries=0, outage_budget_seconds=1.0, outage_pause_initial=0.05,
                 outage_pause_max=0.1)
    assert result.success, failures(result)
    assert HEALTHY_THEN_ONE_503.count("503") == 1 and HEALTHY_THEN_ONE_503.count("answered") > 10
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"
    outcomes = [t["event"] for t in store.reports.transitions_for(pipeline_id=p.id) if t["from_status"] == "waiting"]
    assert outcomes[:2] == ["outage_retry", "outage_over"]  # the pause's retry, then the first answer



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
