"""A code location for the call journal's crash tests: each item of ``enrich`` asks the LLM three things
before it checkpoints (a multi-call item). ``kill_after_calls=N`` kills the run (-9) right after its N-th
answer arrived, before that item's checkpoint (first run only). Settings come from the environment, as
in ledger_defs, so a run worker started as a subprocess (tests/journal_run.py) uses the test's database
and stand-in provider."""

from __future__ import annotations

import os
import signal

from dagster import Field, in_process_executor

from recovery_ext import NodeContext, recoverable_job, recoverable_op
from recovery_ext._dagster.tags import TAG_RESUME_NUMBER

CALLS_PER_ITEM = 3


def questions(table: str) -> list[tuple[str, dict]]:
    return [("describe_entity", {"table": table, "columns": []}),
            ("describe_columns", {"table": table, "columns": [{"name": "id", "primary_key": True}]}),
            ("enrich_term", {"term": table, "tables": [table]})]


@recoverable_op(required_resource_keys={"llm"}, config_schema={
    "items": Field(int, default_value=4),
    "kill_after_calls": Field(int, default_value=-1),
})
def enrich(ctx: NodeContext) -> dict:
    llm = ctx.context.resources.llm.enricher(ctx)
    first_run = TAG_RESUME_NUMBER not in ctx.context.run.tags
    answered = 0
    for item in ctx.items(f"t{i:02d}" for i in range(ctx.op_config["items"])):
        answers = []
        for task, payload in questions(item.key):
            answers.append(llm.complete_json(task, payload))
            answered += 1
            if first_run and answered == ctx.op_config["kill_after_calls"]:
                os.kill(os.getpid(), signal.SIGKILL)  # the answer is journaled, its item not checkpointed
        item.complete(answers)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="journal_job", executor_def=in_process_executor)
def journal_job():
    enrich()
job = journal_job
