"""An ``async def`` body runs on an event loop of its own (``run_coroutine``), in the step's thread, or in a
thread of its own where the caller already runs a loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from recovery_ext._dagster.body import run_coroutine


class _Interrupted(BaseException):
    """As Dagster's interrupt: a BaseException raised inside the body's loop."""


async def _interrupted() -> None:
    await asyncio.sleep(0)
    raise _Interrupted("terminated")


def test_an_error_of_an_async_body_is_not_chained_to_the_look_for_a_running_loop():
    """The traceback a user sees shows the body's error alone, not "During handling of RuntimeError: no running
    event loop" before it."""
    with pytest.raises(_Interrupted) as raised:
        run_coroutine(_interrupted())
    assert raised.value.__context__ is None


def test_an_async_body_called_from_a_running_loop_runs_on_a_thread_of_its_own():
    async def where() -> str:
        return threading.current_thread().name

    async def caller() -> str:
        return run_coroutine(where())

    assert asyncio.run(caller()).startswith("rx-async-body")
