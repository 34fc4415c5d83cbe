"""The demo's LLM stand-in (``python -m recovery_pipelines.demo_llm``, what `make dev` runs) takes the concurrency
the docs suggest: 64 requests arriving at once from the OpenAI SDK's async client, none refused."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

from recovery_pipelines.demo_llm import serve


def test_sixty_four_requests_at_once_from_the_async_sdk_are_all_answered():
    server, url = serve(latency=0.05)

    async def ask_all() -> list[str]:
        async with AsyncOpenAI(base_url=url, api_key="demo", max_retries=0, timeout=30) as client:
            async def one(i: int) -> str:
                answer = await client.chat.completions.create(
                    model="demo-llm", messages=[{"role": "user", "content": f"item {i}"}])
                return answer.choices[0].message.content or ""
            answers = []
            for _ in range(2):  # a second wave, as the next items of a map come
                answers += await asyncio.gather(*map(one, range(64)))
            return answers

    try:
        answers = asyncio.run(ask_all())
    finally:
        server.shutdown()
        server.server_close()
    assert answers == [f"a summary of item {i}" for i in range(64)] * 2
