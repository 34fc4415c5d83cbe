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
                               "kill_after": Field(int, default_value=-1),
                               "resume_in_halves": Field(bool, default_value=False)})
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

    parts = [requests]
    if resumed and ctx.op_config["resume_in_halves"]:  # a resume given a live job's items in two calls
        keys = sorted(requests)
        parts = [{k: requests[k] for k in keys[:len(keys) // 2]}, {k: requests[k] for k in keys[len(keys) // 2:]}]
    for part in parts:
        run_provider_job(ctx, OpenAIBatchJobs(client), part, poll_seconds=ctx.op_config["poll_seconds"], keep=keep)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="batch_kill_job", executor_def=in_process_executor)
def job():
    describe()


@recoverable_op(config_schema={"rounds": Field(int, default_value=4), "items": Field(int, default_value=2)})
def describe_in_rounds(ctx: NodeContext) -> dict:
    """One node that submits batch after batch (as a queue drained in rounds does), more batches than the
    jobs API's ``max_attempts``: each new batch is its items' first attempt."""
    import openai

    client = openai.OpenAI(base_url=os.environ[URL_ENV], api_key="sk-test")
    for r in range(ctx.op_config["rounds"]):
        requests = {f"r{r}t{i}": request(f"r{r}t{i}") for i in range(ctx.op_config["items"])}
        run_provider_job(ctx, OpenAIBatchJobs(client), requests, poll_seconds=0.2, max_attempts=3)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="batch_rounds_job", executor_def=in_process_executor)
def rounds_job():
    describe_in_rounds()
