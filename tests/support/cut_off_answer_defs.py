"""A code location for re-executing a run whose provider answered cut-off JSON
(tests/dagster/test_sdk_transport.py): one node asks the openai SDK once per item through ``LLMResource``,
as docs/how-to/journal.md shows. The provider's URL (``CUT_OFF_LLM_URL``) and the database
(``RECOVERY_DATABASE_URL``) are read at run time, so the test's stand-in and database are used."""

from __future__ import annotations

from dagster import Definitions, EnvVar, in_process_executor

from ledger_defs import recovery_resource
from recovery_ext import LLMResource, NodeContext, recoverable_job, recoverable_op


@recoverable_op(required_resource_keys={"llm"})
def ask_llm(ctx: NodeContext) -> list:
    client = ctx.context.resources.llm.get_client()  # openai.OpenAI, max_retries=0
    for item in ctx.items(["a", "b"]):
        answer = client.chat.completions.create(model="m", max_tokens=64,
                                                messages=[{"role": "user", "content": f"question {item.key}"}])
        item.complete(answer.choices[0].message.content)
    return sorted(ctx.completed_items())


@recoverable_job(executor_def=in_process_executor)
def ask_job():
    ask_llm()


# A provider that keeps answering garbage gives up after 1 s (the outage budget) and fails the pipeline; the
# pauses and the breaker are kept short or out of the way so that the give-up comes quickly.
defs = Definitions(jobs=[ask_job], resources={
    # database_url None: read from the environment at run time, not when a first test imported this module
    "recovery": recovery_resource(database_url=None, outage_budget_seconds=1.0, outage_pause_initial=0.1,
                                  outage_pause_max=0.2, breaker_failure_threshold=1000, max_retries=0),
    "llm": LLMResource(provider="openai", base_url=EnvVar("CUT_OFF_LLM_URL"), model="m", api_key="sk-test",
                       timeout=10, initial_delay=0.05, max_delay=0.1)})
