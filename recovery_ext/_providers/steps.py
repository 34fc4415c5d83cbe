"""One provider call's logic written once, run by a thread or by an event loop.

A guarded call (budget, breaker, journal, ledger, the request itself) is a generator that yields
**steps**: :class:`Blocking` (a store or ledger call), :class:`Sleep` (a wait a stop ends) and
:class:`Io` (the request, or reading its answer). :func:`drive` runs the steps in the calling thread;
:func:`drive_async` awaits the I/O, sleeps with ``asyncio.sleep`` and runs every blocking step in a worker
thread, so a store round trip never holds the event loop. The blocking steps of one call all run in one
``contextvars.Context`` (the call's own copy): the journal's per-attempt context variable is set and
reset in the same context, whichever worker thread runs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from recovery_ext._errors import StopRequested

T = TypeVar("T")

SLICE = 0.2  # a wait is cut in slices this long so that a stop or a check ends it at once


@dataclass
class Blocking:
    """A call that may wait on the database (run in a worker thread by the async driver)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass
class Sleep:
    """Wait ``seconds``; ``stop`` being set (or ``check`` raising) ends the wait at once."""

    seconds: float
    stop: threading.Event | None = None
    check: Callable[[], None] | None = None
    reason: str = "stopped while waiting"


@dataclass
class Io:
    """The request or its body: ``sync()`` in a thread, ``await async_()`` on an event loop."""

    sync: Callable[[], Any] | None
    async_: Callable[[], Awaitable[Any]] | None


Steps = Generator[Blocking | Sleep | Io, Any, T]


class SharedWait:
    """How many of one caller's calls wait now (for budget room, at a spend cap): tens of calls in flight show one
    wait, from the first to start waiting to the last to stop, not one tag write, event and log line each."""

    __slots__ = ("_lock", "_waiting")

    def __init__(self) -> None:
        self._waiting = 0
        self._lock = threading.Lock()  # the calls run in threads, or as tasks whose steps run in worker threads

    def join(self) -> bool:
        """A call starts waiting: whether it is the first (it shows the wait)."""
        with self._lock:
            self._waiting += 1
            return self._waiting == 1

    def leave(self) -> bool:
        """A call stops waiting: whether it was the last (it ends the wait)."""
        with self._lock:
            self._waiting -= 1
            return self._waiting == 0


RETRY_STOPPED = "shutdown requested while waiting to retry"


def checked_sleep(stop: threading.Event | None, check: Callable[[], None] | None,
                  reason: str = RETRY_STOPPED) -> Callable[[float], None]:
    """A blocking sleep that ``stop`` being set (or ``check`` raising) ends within a slice: a retry pause that
    ends once no new call may leave."""
    return lambda seconds: _sleep_sync(Sleep(seconds, stop, check, reason))


def checked_async_sleep(check: Callable[[], None]) -> Callable[[float], Awaitable[None]]:
    """:func:`checked_sleep` for a task (whose stop is its cancellation)."""
    return lambda seconds: _sleep_async(Sleep(seconds, None, check, RETRY_STOPPED))


def _sleep_sync(step: Sleep) -> None:
    deadline = time.monotonic() + step.seconds
    while (left := deadline - time.monotonic()) > 0:
        if step.stop is not None:
            if step.stop.wait(min(left, SLICE)):
                raise StopRequested(step.reason)
        else:
            time.sleep(min(left, SLICE))
        if step.check is not None:
            step.check()


async def _sleep_async(step: Sleep) -> None:
    deadline = time.monotonic() + step.seconds
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, SLICE))
        if step.stop is not None and step.stop.is_set():
            raise StopRequested(step.reason)
        if step.check is not None:
            step.check()


def drive(steps: Steps[T]) -> T:
    """Run ``steps`` in this thread."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        value, error = None, None
        try:
            if isinstance(step, Blocking):
                value = step.fn(*step.args)
            elif isinstance(step, Sleep):
                _sleep_sync(step)
            else:
                assert step.sync is not None, "a synchronous driver got an asynchronous request"
                value = step.sync()
        except BaseException as exc:  # noqa: BLE001 - handed back to the generator, which decides
            error = exc


async def in_thread(context: contextvars.Context, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread, in ``context`` (one context per call: never entered twice at once)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: context.run(fn, *args))


async def drive_async(steps: Steps[T], context: contextvars.Context) -> T:
    """Run ``steps`` on the event loop: blocking steps in worker threads (in ``context``), sleeps and I/O awaited."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        value, error = None, None
        try:
            if isinstance(step, Blocking):
                value = await in_thread(context, step.fn, *step.args)
            elif isinstance(step, Sleep):
                await _sleep_async(step)
            else:
                assert step.async_ is not None, "an asynchronous driver got a synchronous request"
                value = await step.async_()
        except BaseException as exc:  # noqa: BLE001 - handed back to the generator (a cancellation too)
            error = exc
