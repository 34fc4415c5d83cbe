"""The outage clock: it runs from a node's first pause until the node completes or a retry of it finishes an item,
so the outage budget gives up on an overload that persists, answers in between or not, and a healthy stretch after
a pause in which items finished is no outage time; a call's wait at a spend cap or for rate budget room is no
outage time of its own either."""

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
from recovery_pipelines.devserver import wait_for


# an outage budget and pauses short enough for a test: the budget is spent after a few tries
SHORT_OUTAGES = {"outage_budget_seconds": 0.6, "outage_pause_initial": 0.05, "outage_pause_max": 0.1}
# For a run that must not give up: its blips (a few failed calls, each a store write) stay far inside the budget
# on a busy machine too (a CI run gave up on five SQLite writes that took 2 s under a 0.6 s budget).
ROOMY_OUTAGES = {**SHORT_OUTAGES, "outage_budget_seconds": 2.0}


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


def overloaded_until_try_40(ctx: NodeContext) -> int:
    """The overload every try meets after its answers, an error the guard does not see (an error event ending a
    stream after the guarded call returned); the test's own stop at try 40: the node never gave up."""
    RETRIES_SEEN.append(ctx.context.retry_number)
    if ctx.context.retry_number >= 40:
        return -1
    raise ClassifiedError(category="server_error", retryable=True, status_code=503, message="overloaded")


@recoverable_op
def answers_then_stays_overloaded(ctx: NodeContext) -> int:
    """Each try first gets an answer (sent once, then from the journal), then meets an overload the guard does not
    see (an error event ending a stream after the guarded call returned), for ever."""
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None))
    guard.call(lambda question: {"answer": question}, "first")
    return overloaded_until_try_40(ctx)


@recoverable_job(executor_def=in_process_executor)
def stays_overloaded_job():
    answers_then_stays_overloaded()


def test_an_overload_after_an_answer_on_every_try_still_gives_up_at_the_outage_budget(store, db_url):
    """A second review: with the outage clock ended by a node's first answer, a node whose every try got one answer
    (a replay too) before its persistent overload paused and retried for ever, its clock always near 0. The clock
    runs from the node's first pause until the node completes: the outage budget gives up."""
    RETRIES_SEEN.clear()
    result = run(stays_overloaded_job, db_url, max_retries=0, **SHORT_OUTAGES)
    assert not result.success and max(RETRIES_SEEN) < 40, RETRIES_SEEN
    assert any("used up the outage budget" in failure for failure in failures(result)), failures(result)
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "failed"


@recoverable_op
def answers_unkept_then_stays_overloaded(ctx: NodeContext) -> int:
    """Each try gets an answer the journal does not keep (asked again, and paid again, by every try), then the
    overload: such an answer is no progress a retry keeps, so it does not end the outage clock."""
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)
    guard.call(lambda question: {"answer": question}, "first")
    return overloaded_until_try_40(ctx)


@recoverable_job(executor_def=in_process_executor)
def unkept_answers_job():
    answers_unkept_then_stays_overloaded()


def test_answers_the_journal_does_not_keep_do_not_end_the_outage_clock(store, db_url):
    RETRIES_SEEN.clear()
    result = run(unkept_answers_job, db_url, max_retries=0, **SHORT_OUTAGES)
    assert not result.success and max(RETRIES_SEEN) < 40, RETRIES_SEEN
    assert any("used up the outage budget" in failure for failure in failures(result)), failures(result)


def outlive_the_budget(ctx: NodeContext) -> None:
    """A healthy stretch longer than the outage budget: waits until the pipeline's outage clock, read on the
    database clock, is past it (the clock is ended where it is read for a decision, not by this read)."""
    store, budget = store_of(ctx), ctx.resource.outage_budget_seconds
    wait_for(lambda: (store.providers.waiting_seconds(ctx.pipeline_id) or 0.0) > 1.5 * budget, timeout=60,
             interval=0.05, what="the outage clock past the budget")


ASKED: list[str] = []


@recoverable_op
def item_then_healthy_stretch_then_one_503(ctx: NodeContext) -> str:
    """Paused once at its start; its retry finishes an item, works longer than the outage budget, then meets one
    503 on a guarded call, which answers on the next attempt."""
    if ctx.context.retry_number == 0:
        raise ClassifiedError(category="server_error", retryable=True, status_code=503, message="overloaded")
    for item in ctx.items(["page-1"]):
        item.complete({"text": "read"})
    outlive_the_budget(ctx)
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)

    def ask() -> str:
        ASKED.append("asked")
        if len(ASKED) == 1:
            raise busy("one 503 after a healthy stretch")
        return "answer"

    return guard.call(ask)


@recoverable_job(executor_def=in_process_executor)
def healthy_stretch_job():
    item_then_healthy_stretch_then_one_503()


def test_one_503_after_a_healthy_stretch_longer_than_the_budget_is_retried(store, db_url):
    """Before: a node retried after its outage pause kept the pipeline's outage clock from that pause on, through
    any healthy stretch, so its first 503 once the budget had passed gave up for good (OutageBudgetExceeded, the
    pipeline failed). An item its retry finished ended that outage."""
    ASKED.clear()
    result = run(healthy_stretch_job, db_url, max_retries=0, **ROOMY_OUTAGES)
    assert result.success, failures(result)
    assert ASKED == ["asked", "asked"]
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"


TRIES: list[int] = []


@recoverable_op
def item_then_healthy_stretch_then_a_failed_try(ctx: NodeContext) -> int:
    """Paused once at its start; its first retry finishes an item, works longer than the outage budget, then fails
    transiently as a whole (an error the guard did not see); its next retry succeeds."""
    TRIES.append(ctx.context.retry_number)
    if ctx.context.retry_number == 0:
        raise ClassifiedError(category="server_error", retryable=True, status_code=503, message="overloaded")
    for item in ctx.items([f"page-{n}" for n in range(1, 3)]):
        item.complete({"try": ctx.context.retry_number})
        if ctx.context.retry_number == 1:
            outlive_the_budget(ctx)
            raise ClassifiedError(category="server_error", retryable=True, status_code=503,
                                  message="overloaded again")
    return ctx.context.retry_number


@recoverable_job(executor_def=in_process_executor)
def failed_try_job():
    item_then_healthy_stretch_then_a_failed_try()


def test_a_node_failing_after_a_healthy_stretch_pauses_again_instead_of_giving_up(store, db_url):
    """The node's own outage pause: before, its retry's failure after a healthy stretch read the outage clock from
    the first pause and gave up at once. The item the retry finished ended that outage: it pauses again."""
    TRIES.clear()
    result = run(failed_try_job, db_url, max_retries=0, **ROOMY_OUTAGES)
    assert result.success, failures(result)
    assert TRIES == [0, 1, 2]


@recoverable_op
def new_answer_each_try_then_stays_overloaded(ctx: NodeContext) -> int:
    """Each try gets a new answer, kept by the journal under a key no later try asks (its prompt names the try),
    then the overload: an answer is no progress, so the outage clock runs on."""
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None))
    guard.call(lambda question: {"answer": question}, f"asked at try {ctx.context.retry_number}")
    return overloaded_until_try_40(ctx)


@recoverable_job(executor_def=in_process_executor)
def new_answer_job():
    new_answer_each_try_then_stays_overloaded()


class AnswersAfter:
    """A provider that fails ``failures`` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.left = failures

    def __call__(self, question: str) -> dict[str, str]:
        if self.left:
            self.left -= 1
            raise busy()
        return {"answer": question}


@recoverable_op
def paused_call_answers_then_stays_overloaded(ctx: NodeContext) -> int:
    """Each try pauses inside a call, which then answers (not kept), then the overload: in a retried try the answer
    ending the call's pause does not end the outage clock either (a second review: it did, and each try started
    the outage over, for ever)."""
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)
    guard.call(AnswersAfter(ctx.resource.outage_settings().pause_after), "first")
    return overloaded_until_try_40(ctx)


@recoverable_job(executor_def=in_process_executor)
def paused_call_job():
    paused_call_answers_then_stays_overloaded()


def test_answers_each_try_gets_are_no_end_of_a_persistent_overload(store, db_url):
    """Answers kept under a new key each try, and answers ending a pause inside a call: neither ends a retried
    node's outage, so an overload that persists gives up at the budget instead of paying again each try."""
    for job in (new_answer_job, paused_call_job):
        RETRIES_SEEN.clear()
        result = run(job, db_url, max_retries=0, **SHORT_OUTAGES, breaker_failure_threshold=1000)
        assert not result.success and max(RETRIES_SEEN) < 40, (job.name, RETRIES_SEEN)
        assert any("outage budget" in failure for failure in failures(result)), failures(result)


ORDINARY: list[int] = []


@recoverable_op
def ordinary_retry_then_a_blip_and_one_503_after_a_healthy_stretch(ctx: NodeContext) -> str:
    """An ordinary retry (one unguarded timeout, no outage pause, no clock running): a short blip answered inside a
    call ends its outage as in a first try, so a healthy stretch after it and then one 503 do not give up (a second
    review: every retry was taken for one after an outage pause, and the blip's clock ran on)."""
    if ctx.context.retry_number == 0:
        raise ClassifiedError(category="timeout", retryable=True, message="read timeout")
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)
    guard.call(AnswersAfter(ctx.resource.outage_settings().pause_after), "first")
    healthy_until = time.monotonic() + 1.5 * ctx.resource.outage_budget_seconds  # healthy work past the budget
    wait_for(lambda: time.monotonic() > healthy_until, timeout=60, interval=0.05, what="the healthy stretch")
    failing = AnswersAfter(1)

    def one_503(question: str) -> dict[str, str]:
        ORDINARY.append(ctx.context.retry_number)
        return failing(question)

    return guard.call(one_503, "second")["answer"]


@recoverable_job(executor_def=in_process_executor)
def ordinary_retry_job():
    ordinary_retry_then_a_blip_and_one_503_after_a_healthy_stretch()


def test_an_ordinary_retry_is_no_outage_retry(store, db_url):
    ORDINARY.clear()
    result = run(ordinary_retry_job, db_url, max_retries=2, same_error_limit=2, **ROOMY_OUTAGES,
                 breaker_failure_threshold=1000)
    assert result.success, failures(result)
    assert ORDINARY == [1, 1]


LOST: list[int] = []


@recoverable_op
def item_then_an_ordinary_failure(ctx: NodeContext) -> str:
    """Two 503s pause the node; its retry finishes an item, works past the budget, then fails with a timeout (an
    ordinary retry, no pause); the try after it meets one 503 (a second review: only a failure that paused ended
    the outage the item had outlived, so the next try gave up at its first 503)."""
    LOST.append(ctx.context.retry_number)
    if ctx.context.retry_number <= 1:
        raise ClassifiedError(category="server_error", retryable=True, status_code=503, message="overloaded")
    if ctx.context.retry_number == 2:
        for item in ctx.items(["page-1"]):
            item.complete({"text": "read"})
        outlive_the_budget(ctx)
        raise ClassifiedError(category="timeout", retryable=True, message="read timeout")
    guard = provider_guard(ctx, "https://llm.example/v1", ctx.resource.retry_policy(sleep=lambda s: None),
                           journal=False)
    return guard.call(AnswersAfter(1), "third")["answer"]


@recoverable_job(executor_def=in_process_executor)
def ordinary_after_progress_job():
    item_then_an_ordinary_failure()


def test_an_outage_an_item_outlived_is_over_whatever_the_next_failure_leads_to(store, db_url):
    LOST.clear()
    result = run(ordinary_after_progress_job, db_url, max_retries=5, same_error_limit=2, **ROOMY_OUTAGES,
                 breaker_failure_threshold=1000)
    assert result.success, failures(result)
    assert LOST == [0, 1, 2, 3]


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
    budget = ROOMY_OUTAGES["outage_budget_seconds"]
    result = run(spend_cap_job, db_url, outage_budget_seconds=budget, spend_cap_tokens=1000,
                 spend_cap_poll_seconds=0.1, max_retries=0)
    assert result.success, failures(result)
    assert len(SPEND_CAP_CALLS) == 3 and SPEND_CAP_CALLS[1] - SPEND_CAP_CALLS[0] >= 1.5 * budget  # waited at the cap
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"
