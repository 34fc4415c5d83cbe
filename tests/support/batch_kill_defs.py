"""The crash demo's batch job with a kill point while its results are collected: on its first run (not a
resume) ``describe`` kills its own process (-9) right after checkpointing ``kill_after`` items of the
finished batch, so a test can resume a run that died mid-collection. Run by tests/support/journal_run.py."""

from __future__ import annotations

import json
import os
import signal

from dagster import Field, in_process_executor

from recovery_ext import NodeContext, OpenAIBatchJobs, recoverable_job, recoverable_op, run_provider_job
from recovery_ext._dagster.tags import TAG_RESUME_NUMBER
from recovery_pipelines.demo_batch import URL_ENV, request


@recoverable_op(config_schema={"items": Field(int, default_value=6), "poll_seconds": Field(float, default_value=0.2),
                               "kill_after": Field(int, default_value=-1)})
def describe(ctx: NodeContext) -> dict:
    import openai

    client = openai.OpenAI(base_url=os.environ[URL_ENV], api_key="sk-test")
    requests = {f"t{i:02d}": request(f"t{i:02d}") for i in range(ctx.op_config["items"])}
    resumed = TAG_RESUME_NUMBER in ctx.context.run.tags
    kept = []

    def keep(key: str, answer: dict) -> None:
        ctx.checkpoint(key, json.loads(answer["choices"][0]["message"]["content"]))
        kept.append(key)
        if len(kept) == ctx.op_config["kill_after"] and not resumed:
            os.kill(os.getpid(), signal.SIGKILL)

    run_provider_job(ctx, OpenAIBatchJobs(client), requests, poll_seconds=ctx.op_config["poll_seconds"], keep=keep)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="batch_kill_job", executor_def=in_process_executor)
def job():
    describe()
