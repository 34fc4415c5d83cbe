"""A 429's Retry-After closes the endpoint's shared rate budget for at most the caller's ``max_delay``, through
the real openai SDK and LLMResource's transport against a stand-in on 127.0.0.1 (SQLite and PostgreSQL): an hour,
a date a year ahead, a negative number or garbage never keep the endpoint closed for the budget's whole window."""

from __future__ import annotations

import email.utils
import time

import pytest
from dagster import DagsterInstance, in_process_executor
from ledger_defs import recovery_resource
from sdk_stand_in import SdkStandIn

from recovery_ext import LLMResource, NodeContext, execute_in_process, recoverable_job, recoverable_op

WINDOW = 30.0  # the budget's window: what a 429 closed it for before the cap applied
MAX_DELAY = 0.5


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


@pytest.mark.parametrize("retry_after", [
    "3600",
    email.utils.formatdate(time.time() + 365 * 86400, usegmt=True),  # an HTTP date a year ahead
    "-5",
    "soon",
], ids=["an_hour", "a_date_a_year_ahead", "negative", "garbage"])
def test_a_429s_retry_after_closes_the_shared_budget_no_longer_than_max_delay(retry_after, store, db_url,
                                                                              monkeypatch):
    server = SdkStandIn(retry_after=retry_after)
    url = server.start()
    try:
        server.script = [429]
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        llm = LLMResource(base_url=f"{url}/v1", model="m", api_key="sk-test", timeout=10, initial_delay=0.05,
                          max_delay=MAX_DELAY, requests_per_minute=100, budget_window_seconds=WINDOW)
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(ask_job, instance=instance,
                                        resources={"recovery": recovery_resource(), "llm": llm})
        assert result.success
        refused, answered = server.requests
        assert (refused.status, answered.status) == (429, 200)
        # the retry waited for the back-off the 429 put on the shared budget: max_delay, not the window (a
        # generous margin for a busy machine, far below the window the back-off was before)
        assert answered.at - refused.at < WINDOW / 3
    finally:
        server.stop()
