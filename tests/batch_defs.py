"""A code location for the provider-job tests: ``describe`` runs its items as one OpenAI batch (the stand-in
of tests/stand_in_batch.py, at ``LEDGER_LLM_URL``) through ``run_provider_job``."""

from __future__ import annotations

import json
import os

import openai
from dagster import Field, in_process_executor

from recovery_ext import NodeContext, OpenAIBatchJobs, recoverable_job, recoverable_op, run_provider_job
from recovery_pipelines.llm import OpenAICompatibleEnricher


def request(table: str) -> dict:
    payload = {"table": table, "columns": []}
    return {"model": "m", "messages": OpenAICompatibleEnricher.messages("describe_entity", payload),
            "response_format": {"type": "json_object"}}


@recoverable_op(config_schema={"items": Field(int, default_value=6), "poll_seconds": Field(float, default_value=0.2)})
def describe(ctx: NodeContext) -> dict:
    client = openai.OpenAI(base_url=os.environ["LEDGER_LLM_URL"], api_key="sk-test")
    requests = {f"t{i:02d}": request(f"t{i:02d}") for i in range(ctx.op_config["items"])}
    run_provider_job(ctx, OpenAIBatchJobs(client), requests, poll_seconds=ctx.op_config["poll_seconds"],
                     keep=lambda key, answer: ctx.checkpoint(key, json.loads(answer["choices"][0]["message"]["content"])))
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="batch_job", executor_def=in_process_executor)
def job():
    describe()
