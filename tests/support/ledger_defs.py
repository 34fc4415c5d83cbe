"""A code location for the ledger's crash tests: one node asks the LLM one call per item, one node
asks once outside any item. Its settings come from the environment, so a run worker started as a
subprocess (tests/support/ledger_run.py) uses the test's database and stand-in provider."""

from __future__ import annotations

import os
import signal

from dagster import Definitions, Field, in_process_executor, multiprocess_executor

from recovery_ext import NodeContext, RecoveryResource, recoverable_job, recoverable_op
from recovery_ext._dagster.tags import TAG_RESUME_NUMBER
from recovery_pipelines.llm import LLMResource

PRICES = {"m": {"input": 1.5, "output": 6.0}}  # per million tokens


@recoverable_op(required_resource_keys={"llm"}, config_schema={
    "items": Field(int, default_value=6),
    "kill_after": Field(int, default_value=-1, description="first run only: kill -9 this process after N checkpoints"),
})
def ask(ctx: NodeContext) -> dict:
    llm = ctx.context.resources.llm.enricher(ctx)
    resumed = TAG_RESUME_NUMBER in ctx.context.run.tags
    for done, item in enumerate(ctx.items(f"t{i:02d}" for i in range(ctx.op_config["items"])), start=1):
        item.complete(llm.complete_json("describe_entity", {"table": item.key, "columns": []}))
        if done == ctx.op_config["kill_after"] and not resumed:
            os.kill(os.getpid(), signal.SIGKILL)
    return {"tables": sorted(ctx.completed_items())}


@recoverable_op(required_resource_keys={"llm"})
def summarize(ctx: NodeContext, asked: dict) -> dict:
    llm = ctx.context.resources.llm.enricher(ctx)
    entities = [{"name": t, "table": t} for t in asked["tables"][:3]]
    return llm.complete_json("glossary", {"entities": entities})  # one call outside any item


def make_ledger_job(executor_def=multiprocess_executor):
    @recoverable_job(name="ledger_job", executor_def=executor_def)
    def ledger_job():
        summarize(ask())

    return ledger_job


def recovery_resource(**overrides) -> RecoveryResource:
    return RecoveryResource(**{"database_url": os.environ.get("RECOVERY_DATABASE_URL"),
                               "heartbeat_interval": float(os.environ.get("LEDGER_HEARTBEAT_INTERVAL", "0.5")),
                               "heartbeat_timeout": float(os.environ.get("LEDGER_HEARTBEAT_TIMEOUT", "3")),
                               "max_retries": 2, "retry_initial_delay": 0.05, "retry_max_delay": 0.1, **overrides})


def llm_resource(url: str | None = None, **overrides) -> LLMResource:
    return LLMResource(**{"base_url": url or os.environ.get("LEDGER_LLM_URL"), "model": "m", "api_key": "sk-test",
                          "timeout": 30, "initial_delay": 0.05, "max_delay": 3.0, "max_tokens": 256,
                          "prices": PRICES, **overrides})


ledger_job = make_ledger_job()
ledger_job_inprocess = make_ledger_job(in_process_executor)

defs = Definitions(jobs=[ledger_job], resources={"recovery": recovery_resource(), "llm": llm_resource()})


def bound_ledger_job():
    """The multiprocess job with its resources, for ``reconstructable``."""
    return defs.get_job_def("ledger_job")
