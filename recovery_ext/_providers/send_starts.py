"""The journaled calls of one event loop start one at a time, each holding the start for a few turns of the loop.

``ajournaled_call`` commits a call's journal entry before it sends, through the node's group commit, which settles
the entries of many tasks at once: those tasks resume in the same turn of the loop and start their requests
together. httpx's connection pool (httpcore 1.0) gives every request queued in one pass the same idle connection
and learns it was taken only after an await, so all but one of them retry, and each retry is another pass over
every pooled connection (a pass costs more per idle connection, encode/httpcore#1035). At 64 items in flight
that was most of an async op's CPU: 4.4 pool retries and about 6 ms of pool passes per item, against 1.1 and
0.9 ms for a plain op making the same calls (``RX_CONC_POOL_STATS=1 python -m bench.concurrency_bench``).

So a journaled call starts alone: it holds its loop's start for :data:`START_TURNS` turns (httpcore 1.0.9 claims
the chosen connection a few awaits after choosing it), or until its send ends, and then the next one starts. The
sends themselves run on together. The journaling transport needs none of this: its journal writes run in worker
threads, which finish one by one, so its requests already start apart (measured: no pool retry at 64).
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from recovery_ext._errors import ConfigurationError

T = TypeVar("T")

START_TURNS = 3  # measured with httpcore 1.0.9: no pool retry at 64 items in flight

_starts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _start_of(loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
    start = _starts.get(loop)
    if start is None:
        start = _starts[loop] = asyncio.Lock()
    return start


async def start_alone(send: Callable[[], Awaitable[T]]) -> T:
    """``await send()``, started while no other journaled call of this loop is starting.

    The send runs as a task of its own (in a copy of this task's context, as ``asyncio`` copies it), so it goes on
    once the start is handed to the next call; cancelling this task cancels it.
    """
    sending: asyncio.Future[T] | None = None
    try:
        async with _start_of(asyncio.get_running_loop()):
            started = send()
            if not inspect.isawaitable(started):
                raise ConfigurationError(
                    f"ajournaled_call: send() returned {type(started).__name__}, not an awaitable; pass an async "
                    "function (or one returning a coroutine), or call journaled_call for a synchronous send")
            sending = asyncio.ensure_future(started)
            for _ in range(START_TURNS):  # the send's first steps run in these turns, no other send's
                await asyncio.sleep(0)
                if sending.done():
                    break
        return await sending
    except BaseException:
        if sending is not None:
            sending.cancel()
        raise
