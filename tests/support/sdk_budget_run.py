"""One process of the budget test: a recoverable op sends ``TASKS`` requests at once from asyncio tasks through
LLMResource's async client, under a tokens-per-window budget shared through the test's database."""

from __future__ import annotations

import asyncio
import os
import sys

from dagster import DagsterInstance, in_process_executor

from recovery_ext import LLMResource, NodeContext, RecoveryResource, execute_in_process, recoverable_job, recoverable_op


@recoverable_op(required_resource_keys={"llm"})
def many_at_once(ctx: NodeContext) -> int:
    llm = ctx.context.resources.llm
    tag = os.environ["BUDGET_TAG"]

    async def one(client, n: int) -> str:
        answer = await client.chat.completions.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": f"question {tag}-{n}"}])
        return answer.choices[0].message.content

    async def everything() -> list[str]:
        client = llm.get_async_client()
        return await asyncio.gather(*(one(client, n) for n in range(int(os.environ["BUDGET_TASKS"]))))

    return len(asyncio.run(everything()))


@recoverable_job(name="sdk_budget_job", executor_def=in_process_executor)
def sdk_budget_job():
    many_at_once()


if __name__ == "__main__":
    llm = LLMResource(base_url=os.environ["BUDGET_LLM_URL"] + "/v1", model="m", api_key="sk-test", timeout=60,
                      initial_delay=0.05, max_delay=5.0, tokens_per_minute=int(os.environ["BUDGET_TOKENS"]),
                      budget_window_seconds=float(os.environ["BUDGET_WINDOW"]), max_tokens=16)
    recovery = RecoveryResource(database_url=os.environ["RECOVERY_DATABASE_URL"])
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(sdk_budget_job, instance=instance, resources={"recovery": recovery, "llm": llm})
    sys.exit(0 if result.success else 1)
