"""The tee a streamed answer is read through, driven alone over a stream that never ends (a connection held open
after its last event): whatever stops its reader once the answer's last event came, the attempt is finished once,
as answered, and a stop goes on; before that event it is finished as failed with the error that stopped it."""

from __future__ import annotations

import asyncio
import contextvars
import functools

import anyio
import httpx
import pytest

from recovery_ext._providers.http_answers import stream_reached_end
from recovery_ext._providers.transport import transport_classes

PATH = "/v1/chat/completions"
WHOLE = (b'data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}, '
         b'"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
HALF = b'data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'


class HeldOpen(httpx.AsyncByteStream):
    """The chunks, then a connection that stays open: a read after them waits until it is cancelled."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk
        await asyncio.sleep(3600)

    async def aclose(self) -> None:
        pass


def tee(finished: list, *chunks: bytes):
    def finish(body: bytes, error: BaseException | None):
        finished.append((body, None if error is None else type(error).__name__))
        return None
        yield  # steps: a generator, as the transport's finish is

    tee_stream = transport_classes(httpx)[1].tee_stream
    return tee_stream(HeldOpen(*chunks), finish, functools.partial(stream_reached_end, api_path=PATH),
                      contextvars.copy_context(), None)


def test_a_close_cancelled_by_an_anyio_scope_after_the_last_event_keeps_the_answer():
    """A review: httpx closes the response inside the caller's cancelled anyio scope (a move_on_after around
    `async with client.stream(...)`), and the close caught only Exception: the attempt was never finished, its
    whole answer not kept and its room not given back."""
    finished: list = []

    async def main() -> None:
        stream = tee(finished, WHOLE)
        reader = stream.__aiter__()
        assert await reader.__anext__() == WHOLE
        with anyio.CancelScope() as scope:  # level-triggered: every await in it is cancelled
            scope.cancel()
            await stream.aclose()
        assert scope.cancelled_caught  # the cancellation went on
        # finished by the close itself (before, only the reader's own finalization, whenever the garbage
        # collector came to it, could rescue the answer)
        assert finished == [(WHOLE, None)]
        await reader.aclose()

    asyncio.run(main())
    assert finished == [(WHOLE, None)]  # once, as answered


def test_a_read_cancelled_before_the_last_event_fails_the_attempt_and_the_cancellation_goes_on():
    finished: list = []

    async def main() -> None:
        stream = tee(finished, HALF)
        with anyio.move_on_after(0.05) as scope:
            async for _ in stream:
                pass
        assert scope.cancelled_caught

    asyncio.run(main())
    assert finished == [(HALF, "CancelledError")]


def test_a_whole_check_that_cannot_read_an_event_leaves_the_error_in_flight_unchanged():
    """A review: an event nested too deep raised RecursionError out of the whole-answer check, which replaced the
    cancellation (swallowed) and left the attempt unfinished."""
    finished: list = []
    deep = b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"

    async def main() -> None:
        stream = tee(finished, HALF + deep)
        task = asyncio.ensure_future(anext(stream.__aiter__()))
        with pytest.raises(Exception, match="event 2 of the stream"):  # the gate's broken event, as before
            await task

    asyncio.run(main())
    assert [error for _, error in finished] == ["_BrokenEvent"]
