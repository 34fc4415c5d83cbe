"""A job that describes its tables as one Anthropic message batch (``run_provider_job`` with
``AnthropicBatchJobs``) against the stand-in at ``$RECOVERY_ANTHROPIC_URL``; on its first run (not a resume)
``describe`` kills its own process (-9) right after checkpointing ``kill_after`` items, so a test can resume a
run that died between two results. Run by tests/support/journal_run.py."""

from __future__ import annotations

import os
import signal

from dagster import Field, in_process_executor

from recovery_ext import AnthropicBatchJobs, NodeContext, recoverable_job, recoverable_op, run_provider_job
from recovery_ext._dagster.tags import TAG_RESUME_NUMBER

URL_ENV = "RECOVERY_ANTHROPIC_URL"


def request(table: str) -> dict:
    return {"model": "claude-stand-in", "max_tokens": 256,
            "messages": [{"role": "user", "content": f"Describe the table {table} in one sentence."}]}


@recoverable_op(config_schema={"items": Field(int, default_value=6), "poll_seconds": Field(float, default_value=0.2),
                               "kill_after": Field(int, default_value=-1)})
def describe(ctx: NodeContext) -> dict:
    import anthropic

    client = anthropic.Anthropic(base_url=os.environ[URL_ENV], api_key="sk-ant-test", max_retries=1)
    requests = {f"t{i:02d}": request(f"t{i:02d}") for i in range(ctx.op_config["items"])}
    resumed = TAG_RESUME_NUMBER in ctx.context.run.tags
    kept = []

    def keep(key: str, message: dict) -> None:
        ctx.checkpoint(key, {"description": message["content"][0]["text"]})
        kept.append(key)
        if len(kept) == ctx.op_config["kill_after"] and not resumed:
            os.kill(os.getpid(), signal.SIGKILL)

    run_provider_job(ctx, AnthropicBatchJobs(client), requests, poll_seconds=ctx.op_config["poll_seconds"], keep=keep)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="anthropic_batch_job", executor_def=in_process_executor)
def job():
    describe()
