"""A 429's Retry-After closes the endpoint's shared rate budget for at most the caller's ``max_delay``, through
the real openai SDK and LLMResource's transport against a stand-in on 127.0.0.1 (SQLite and PostgreSQL): an hour,
a date a year ahead, a negative number or garbage never keep the endpoint closed for the budget's whole window; and
a burst of 429s, tens of calls in flight refused at once, is the budget's to back off from, not an outage that opens
the circuit breaker."""

from __future__ import annotations

import email.utils
import time

import pytest
from dagster import DagsterInstance, in_process_executor
import store_rows
from ledger_defs import recovery_resource
from sdk_stand_in import SdkStandIn

from recovery_ext import LLMResource, NodeContext, execute_in_process, recoverable_job, recoverable_op

WINDOW = 30.0  # the budget's window: what a 429 closed it for before the cap applied
MAX_DELAY = 0.5
BURST = 8  # calls in flight at once, each refused with a 429 first: more than the breaker's threshold of 5


@recoverable_op(required_resource_keys={"llm"})
def ask_once(ctx: NodeContext) -> str:
    llm = ctx.context.resources.llm
    for item in ctx.items(["only"]):
        answer = llm.get_client().chat.completions.create(
            model=llm.model, max_tokens=16, messages=[{"role": "user", "content": "question"}])
        item.complete(answer.choices[0].message.content)
    return "done"


@recoverable_job(executor_def=in_process_executor)
def ask_job():
    ask_once()


@recoverable_op(required_resource_keys={"llm"})
def ask_in_parallel(ctx: NodeContext) -> int:
    llm = ctx.context.resources.llm
    client = llm.get_client()

    def ask(item) -> str:
        answer = client.chat.completions.create(
            model=llm.model, max_tokens=16, messages=[{"role": "user", "content": item.key}])
        return answer.choices[0].message.content

    return ctx.map(ask, [f"k{i}" for i in range(BURST)], concurrency=BURST).done


@recoverable_job(executor_def=in_process_executor)
def ask_in_parallel_job():
    ask_in_parallel()


def run_against(job, server: SdkStandIn, script: list[int | str], db_url: str, monkeypatch, *,
                requests_per_minute: int):
    """``job`` on its own ephemeral instance, its LLM the stand-in (started here) answering ``script`` first."""
    url = server.start()
    server.script = script
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    llm = LLMResource(base_url=f"{url}/v1", model="m", api_key="sk-test", timeout=10, initial_delay=0.05,
                      max_delay=MAX_DELAY, requests_per_minute=requests_per_minute, budget_window_seconds=WINDOW)
    with DagsterInstance.ephemeral() as instance:
        return execute_in_process(job, instance=instance, resources={"recovery": recovery_resource(), "llm": llm})


@pytest.mark.parametrize("retry_after", [
    "3600",
    email.utils.formatdate(time.time() + 365 * 86400, usegmt=True),  # an HTTP date a year ahead
    "-5",
    "soon",
], ids=["an_hour", "a_date_a_year_ahead", "negative", "garbage"])
def test_a_429s_retry_after_closes_the_shared_budget_no_longer_than_max_delay(retry_after, store, db_url,
                                                                              monkeypatch):
    server = SdkStandIn(retry_after=retry_after)
    try:
        result = run_against(ask_job, server, [429], db_url, monkeypatch, requests_per_minute=100)
        assert result.success
        refused, answered = server.requests
        assert (refused.status, answered.status) == (429, 200)
        # the retry waited for the back-off the 429 put on the shared budget: max_delay, not the window (a
        # generous margin for a busy machine, far below the window the back-off was before)
        assert answered.at - refused.at < WINDOW / 3
    finally:
        server.stop()


def test_a_burst_of_429s_backs_the_shared_budget_off_without_opening_the_circuit_breaker(store, db_url,
                                                                                         monkeypatch):
    """A trial found that a burst of 429s (every call in flight refused once) opened the endpoint's breaker for
    25-53 s, far longer than the provider's Retry-After or the caller's max_delay. With a rate budget shared, a 429 is
    the provider's answer about the rate: everybody backs off for its Retry-After, and the breaker hears an answer."""
    server = SdkStandIn(retry_after=0.2)
    try:
        result = run_against(ask_in_parallel_job, server, [429] * BURST, db_url, monkeypatch,
                             requests_per_minute=1000)
        assert result.success
        assert result.output_for_node("ask_in_parallel") == BURST
        assert sorted(server.statuses()) == [200] * BURST + [429] * BURST  # each item asked twice, answered once
        kinds = [e["kind"] for e in store.reports.recent_events()]
        assert "breaker_opened" not in kinds
        assert all(row["state"] == "closed" and row["consecutive_failures"] == 0 for row in store.providers.breakers())
        # the 429s closed the shared budget: that, not the breaker, held the retries back
        (budget,) = store_rows.budgets(store)
        assert budget["backoff_until"] is not None and budget["backoff_streak"] >= 1
    finally:
        server.stop()
