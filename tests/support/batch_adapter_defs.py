"""A job that describes its tables as one provider batch through ``run_provider_job``, with the adapter its config
names (``anthropic``: ``AnthropicBatchJobs``; ``bedrock``: ``BedrockBatchJobs``; ``gemini``:
``GeminiBatchJobs``) against the stand-in at
``$RECOVERY_BATCH_STAND_IN_URL``; on its first run (not a resume) ``describe`` kills its own process (-9) right
after checkpointing ``kill_after`` items, so a test can resume a run that died between two results. Run by
tests/support/journal_run.py."""

from __future__ import annotations

import os
from typing import Any

from dagster import Field, in_process_executor

from recovery_ext import (AnthropicBatchJobs, BedrockBatchJobs, GeminiBatchJobs, NodeContext, recoverable_job,
                          recoverable_op, run_provider_job)
from provider_job_runs import keeper_that_dies

URL_ENV = "RECOVERY_BATCH_STAND_IN_URL"


def anthropic_jobs(url: str) -> Any:
    import anthropic

    return AnthropicBatchJobs(anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=1))


def bedrock_jobs(url: str) -> Any:
    return BedrockBatchJobs.connect(region_name="us-east-1", endpoint_url=url, s3_endpoint_url=url,
                                    model_id="anthropic.claude-3-5-haiku-20241022-v1:0",
                                    role_arn="arn:aws:iam::000000000000:role/batch", input_uri="s3://batches/in",
                                    output_uri="s3://batches/out")


def gemini_jobs(url: str) -> Any:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="stand-in", http_options=types.HttpOptions(base_url=url))
    return GeminiBatchJobs(client, model="gemini-2.5-flash", base_url=url)


ADAPTERS = {"anthropic": anthropic_jobs, "bedrock": bedrock_jobs, "gemini": gemini_jobs}


def request(provider: str, table: str) -> dict:
    prompt = f"Describe the table {table} in one sentence."
    if provider == "gemini":  # a GenerateContentRequest
        return {"contents": [{"role": "user", "parts": [{"text": prompt}]}],
                "generationConfig": {"maxOutputTokens": 256}}
    # an Anthropic Messages body: the Messages API names its model in it, Bedrock in the job (with the version)
    head = {"model": "claude-haiku-4-5"} if provider == "anthropic" else {"anthropic_version": "bedrock-2023-05-31"}
    return {**head, "max_tokens": 256, "messages": [{"role": "user", "content": prompt}]}


def text_of(answer: dict) -> str:
    """The answer's text: an Anthropic message's first block, or a Gemini response's first candidate."""
    if "candidates" in answer:
        return answer["candidates"][0]["content"]["parts"][0]["text"]
    return answer["content"][0]["text"]


@recoverable_op(config_schema={"provider": Field(str), "items": Field(int, default_value=6),
                               "poll_seconds": Field(float, default_value=0.2),
                               "kill_after": Field(int, default_value=-1)})
def describe(ctx: NodeContext) -> dict:
    provider = ctx.op_config["provider"]
    jobs = ADAPTERS[provider](os.environ[URL_ENV])
    requests = {f"t{i:02d}": request(provider, f"t{i:02d}") for i in range(ctx.op_config["items"])}
    keep = keeper_that_dies(ctx, lambda message: {"description": text_of(message)})
    run_provider_job(ctx, jobs, requests, poll_seconds=ctx.op_config["poll_seconds"], keep=keep)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="provider_batch_job", executor_def=in_process_executor)
def job():
    describe()
