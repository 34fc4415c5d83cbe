"""The bundles a recoverable node's execution passes along: what the node declares, and one run of it."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dagster import Failure, RetryPolicy

from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._store.interfaces import OpStore
from recovery_ext._dagster.resources import RecoveryResource


@dataclass(frozen=True)
class RecoveryOptions:
    """How a recoverable op or asset reaches its recovery resource, and the liveness and retries it asks for."""

    resource_key: str = "recovery"
    retry_policy: RetryPolicy | None = None
    heartbeat: HeartbeatSettings | None = None  # None: the resource's settings


@dataclass(frozen=True)
class NodeDefinition:
    """A node as its decorator declared it: its name, its body and what to do when it had already finished."""

    name: str
    body: Callable[..., Any]
    heartbeat: HeartbeatSettings | None = None  # None: the resource's settings
    optional: bool = False  # degrades instead of failing the pipeline
    on_skip: Callable[[Any], Any] | None = None  # what a finished node returns (default: its recorded output)


@dataclass(frozen=True)
class NodeRun:
    """One execution of a node in this step: what every stage after finding the pipeline needs."""

    context: Any  # Dagster's op or asset execution context
    store: OpStore
    resource: RecoveryResource
    settings: HeartbeatSettings  # the node's, else the resource's
    node: NodeDefinition

    @property
    def name(self) -> str:
        return self.node.name


def call_body(body: Callable[..., Any], ctx: Any, inputs: dict[str, Any]) -> Any:
    """``body(ctx, **inputs)``; an ``async def`` body's coroutine is run to its end here, in the step's thread,
    so everything around it (the node's claim, heartbeats, its completion) is the same as for a sync body."""
    value = body(ctx, **inputs)
    if inspect.iscoroutine(value):
        return run_coroutine(value)
    if inspect.isasyncgen(value):
        raise Failure(description=f"{getattr(body, '__name__', 'the body')} is an async generator: a recoverable "
                                  "body is `def` or `async def` and returns its value (yield is for sync bodies)",
                      allow_retries=False)
    return value


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on an event loop of its own; where this thread already runs a loop (an async caller of
    ``execute_in_process``), on a thread of its own, with this context."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(1, thread_name_prefix="rx-async-body") as pool:
        return pool.submit(context.run, asyncio.run, coro).result()
