"""Jobs whose nodes work their items in parallel (``ctx.map`` threads, ``ctx.amap`` tasks, ``ctx.aitems``),
each item asking the echo stand-in (echo_provider.py) through the call journal.

Config: the stand-in's ``url``, how many ``keys``, the ``concurrency``; ``flaky`` items raise a transient
error once after their answer arrived (an item retry must replay that answer, not pay again);
``kill_after`` kills this process (-9) once that many answers arrived (first run only), with the
others still in flight. Settings come from the environment too (``PARALLEL_URL``), so a run worker
started as a subprocess (parallel_run.py) reaches the test's stand-in.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import httpx
from dagster import Config, Definitions, define_asset_job, in_process_executor

from recovery_ext import ProviderCall, ajournaled_call, journaled_call, record_provider_call, recoverable_asset
from recovery_ext import LLMResource, recoverable_job
from recovery_ext import recoverable_op, with_recovery
from recovery_ext._dagster.context import Item, NodeContext
from recovery_ext._dagster.tags import TAG_RESUME_NUMBER


class ParallelConfig(Config):
    url: str = ""
    keys: int = 24
    concurrency: int = 8
    retries: int = 2
    flaky: list[str] = []
    kill_after: int = -1
    bad_result: list[str] = []
    repeat_key: str = ""  # given twice in the keys (refused before any work)
    odd_key: str = ""  # "surrogate": one more key no checkpoint could store (refused before any work)
    max_tokens: int = 10  # what an SDK request asks at most: its spend cap estimate


class Flaky(ConnectionError):
    """A transient failure after the answer arrived (the classifier retries connection errors)."""


_answered = 0
_answered_lock = threading.Lock()
_flaked: set[tuple[str, str]] = set()


def _url(config: ParallelConfig) -> str:
    return config.url or os.environ["PARALLEL_URL"]


def _after_answer(ctx: NodeContext, config: ParallelConfig, key: str) -> None:
    global _answered
    with _answered_lock:
        _answered += 1
        answered = _answered
        flake = key in config.flaky and (ctx.context.run_id, key) not in _flaked
        _flaked.add((ctx.context.run_id, key))
    first_run = TAG_RESUME_NUMBER not in ctx.context.run.tags
    if first_run and answered == config.kill_after:
        os.kill(os.getpid(), signal.SIGKILL)  # answers journaled, items in flight, checkpoints pending
    if flake:
        raise Flaky(f"connection reset after the answer for {key}")


def ask(url: str, key: str) -> dict:
    """One journaled request for ``key``; its usage completes the request's ledger row."""
    body = {"item": key}

    def send() -> dict:
        answer = httpx.post(url, json=body, timeout=60).raise_for_status().json()
        usage = answer["usage"]
        record_provider_call(ProviderCall(endpoint=url, model="echo", tokens_in=usage["prompt_tokens"],
                                          tokens_out=usage["completion_tokens"]))
        return answer

    return journaled_call(send, endpoint=url, model="echo", request=body)


async def aask(client: httpx.AsyncClient, url: str, key: str) -> dict:
    """``ask`` for async code: the request awaited, the journal's writes off the event loop."""
    body = {"item": key}

    async def send() -> dict:
        answer = (await client.post(url, json=body, timeout=60)).raise_for_status().json()
        usage = answer["usage"]
        record_provider_call(ProviderCall(endpoint=url, model="echo", tokens_in=usage["prompt_tokens"],
                                          tokens_out=usage["completion_tokens"]))
        return answer

    return await ajournaled_call(send, endpoint=url, model="echo", request=body)


def keys_of(config: ParallelConfig) -> list[str]:
    odd = {"": [], "surrogate": ["scan-\udcff.png"]}[config.odd_key]
    return [f"k{i:05d}" for i in range(config.keys)] + ([config.repeat_key] if config.repeat_key else []) + odd


def result_of(config: ParallelConfig, key: str, answer: dict) -> object:
    if key in config.bad_result:
        return {"not json": object()}
    return {"key": key, "answer": answer["answer"], "asked_for": answer["item"]}


@recoverable_op
def threaded(ctx: NodeContext, config: ParallelConfig) -> dict:
    def one(item: Item) -> object:
        answer = ask(_url(config), item.key)
        _after_answer(ctx, config, item.key)
        return result_of(config, item.key, answer)

    result = ctx.map(one, keys_of(config), concurrency=config.concurrency, retries=config.retries)
    return {"done": result.done, "resumed": result.resumed}


@recoverable_op
async def tasks(ctx: NodeContext, config: ParallelConfig) -> dict:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        async def one(item: Item) -> object:
            answer = await aask(client, _url(config), item.key)  # the item travels with the task
            _after_answer(ctx, config, item.key)
            return result_of(config, item.key, answer)

        result = await ctx.amap(one, keys_of(config), concurrency=config.concurrency, retries=config.retries)
    return {"done": result.done, "resumed": result.resumed}


@recoverable_op
async def sequential_async(ctx: NodeContext, config: ParallelConfig) -> dict:
    done = 0
    async for item in ctx.aitems(keys_of(config)):
        answer = await asyncio.to_thread(ask, _url(config), item.key)
        await item.acomplete(result_of(config, item.key, answer))
        done += 1
    return {"done": done}


@recoverable_op
def wrong_kind(ctx: NodeContext, config: ParallelConfig) -> dict:
    def sync_one(item: Item) -> object:
        return item.key

    asyncio.run(ctx.amap(sync_one, keys_of(config), concurrency=config.concurrency))  # type: ignore[arg-type]
    return {}


@recoverable_op
async def unawaited(ctx: NodeContext, config: ParallelConfig) -> dict:
    """The slip ``ctx.amap(...)`` without ``await``: Python only warns, at collection, of a coroutine never awaited.
    Before it, a batched loop left early: its two completions are still buffered when the body returns."""
    for item in ctx.items(["kept-1", "kept-2", "left"], batch=10):
        if item.key == "left":
            break
        item.complete({"kept": item.key})

    async def one(item: Item) -> object:
        return await aask(client, _url(config), item.key)

    async with httpx.AsyncClient() as client:
        ctx.amap(one, keys_of(config), concurrency=config.concurrency)  # noqa: RUF006 - the slip under test
    return {"done": "?"}


@recoverable_job(executor_def=in_process_executor)
def unawaited_job():
    unawaited()


@recoverable_job(executor_def=in_process_executor)
def threaded_job():
    threaded()


@recoverable_job(executor_def=in_process_executor)
def tasks_job():
    tasks()


@recoverable_job(executor_def=in_process_executor)
def sequential_async_job():
    sequential_async()


@recoverable_job(executor_def=in_process_executor)
def wrong_kind_job():
    wrong_kind()


@recoverable_asset
async def summaries(ctx: NodeContext, config: ParallelConfig) -> dict:
    async def one(item: Item) -> object:
        # a request in a worker thread: the item travels with the task's context into it
        answer = await asyncio.to_thread(ask, _url(config), item.key)
        return result_of(config, item.key, answer)

    result = await ctx.amap(one, keys_of(config), concurrency=config.concurrency)
    return {"done": result.done}


summaries_job = define_asset_job("summaries_job", selection=[summaries])


def asset_definitions(recovery) -> Definitions:
    return Definitions(assets=[summaries], jobs=[summaries_job], executor=with_recovery(in_process_executor),
                       resources={"recovery": recovery})


@recoverable_op
async def sdk_tasks(ctx: NodeContext, config: ParallelConfig) -> dict:
    """Items through the OpenAI SDK's async client and the journaling transport (an SDK wraps what the transport
    raises: a take-over reaches the op inside the SDK's connection error)."""
    client = LLMResource(base_url=_url(config), api_key="stand-in", model="m",
                         max_tokens=config.max_tokens).get_async_client()

    async def one(item: Item) -> object:
        answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": item.key}])
        return {"key": item.key, "answer": answer.choices[0].message.content}

    result = await ctx.amap(one, keys_of(config), concurrency=config.concurrency, retries=config.retries)
    return {"done": result.done}


@recoverable_job(executor_def=in_process_executor)
def sdk_tasks_job():
    sdk_tasks()
