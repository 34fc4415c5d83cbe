"""Journaled requests of one event loop start one at a time (``recovery_ext._providers.send_starts``).

The tasks a group commit releases resume together; started together, their requests all take the same idle
connection of httpx's pool and all but one retry. The unit cases pin the contract (spacing,
results, errors, cancellation); the last one runs 32 items in flight through ``ajournaled_call`` and one
``httpx.AsyncClient`` against a stand-in and counts the pool's retries.
"""

from __future__ import annotations

import asyncio

import httpcore
import pytest

import parallel_defs
from echo_provider import EchoProvider
from recovery_ext import ConfigurationError, RecoveryResource, execute_in_process
from recovery_ext._providers.send_starts import START_TURNS, start_alone

pytestmark = pytest.mark.timeout(240)


class Turns:
    """Counts the turns of the running loop: a task that yields once a turn."""

    def __init__(self) -> None:
        self.now = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            self.now += 1
            await asyncio.sleep(0)

    def __enter__(self) -> Turns:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def test_sends_released_together_start_one_at_a_time_and_each_returns_its_own_answer():
    async def main() -> tuple[list[int], list[int]]:
        starts: list[int] = []
        with Turns() as turns:
            async def send(i: int) -> int:
                starts.append(turns.now)
                await asyncio.sleep(0.01)  # still in flight when the next one starts
                return i

            answers = await asyncio.gather(*(start_alone(lambda i=i: send(i)) for i in range(8)))
        return starts, answers

    starts, answers = asyncio.run(main())
    assert answers == list(range(8))
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    assert len(starts) == 8 and min(gaps) >= START_TURNS - 1, gaps  # together, every gap would be 0


def test_a_send_that_fails_raises_its_own_error_and_the_next_one_still_starts():
    async def main() -> list[object]:
        async def send(i: int) -> int:
            if i == 1:
                raise ValueError("refused")
            return i

        return await asyncio.gather(*(start_alone(lambda i=i: send(i)) for i in range(3)), return_exceptions=True)

    first, second, third = asyncio.run(main())
    assert (first, third) == (0, 2)
    assert isinstance(second, ValueError) and str(second) == "refused"


def test_a_synchronous_send_is_refused_with_a_clear_error_and_frees_the_slot():
    async def main() -> int:
        with pytest.raises(ConfigurationError, match="send\\(\\) returned dict, not an awaitable"):
            await start_alone(lambda: {"answer": 1})

        async def quick() -> int:
            return 7

        return await asyncio.wait_for(start_alone(quick), 5)

    assert asyncio.run(main()) == 7


def test_cancelling_the_caller_cancels_its_send_and_frees_the_slot():
    async def main() -> tuple[bool, int]:
        cancelled = asyncio.Event()

        async def slow() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        caller = asyncio.create_task(start_alone(slow))
        for _ in range(START_TURNS + 2):
            await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.wait_for(cancelled.wait(), 5)

        async def quick() -> int:
            return 7

        return cancelled.is_set(), await asyncio.wait_for(start_alone(quick), 5)

    assert asyncio.run(main()) == (True, 7)


def test_32_items_in_flight_never_race_for_a_pooled_connection(store, db_url, monkeypatch):
    """Items through ``ajournaled_call`` and one ``httpx.AsyncClient``: the tasks each group commit releases start
    their requests apart, so no request is handed a connection another one took."""
    retries = []
    clear = httpcore._async.connection_pool.AsyncPoolRequest.clear_connection

    def counted(self):  # httpcore: a request whose connection another request took first
        retries.append(1)
        return clear(self)

    monkeypatch.setattr(httpcore._async.connection_pool.AsyncPoolRequest, "clear_connection", counted)
    with EchoProvider(latency=0.05) as provider:
        recovery = RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=5)
        result = execute_in_process(parallel_defs.tasks_job, resources={"recovery": recovery},
                                    run_config={"ops": {"tasks": {"config": {"url": provider.url, "keys": 256,
                                                                             "concurrency": 32}}}})
        assert result.success
        assert result.output_for_node("tasks") == {"done": 256, "resumed": 0}
        assert sum(provider.paid.values()) == 256
    assert retries == []
