"""A journaling transport for httpx: provider SDKs (OpenAI, Anthropic, Groq, Mistral, Together, ...) used
as they are, each request journaled, budgeted, recorded and retried.

Every request made through it from inside a recoverable node:

* is keyed by the caller's ``Idempotency-Key`` header, else by a fingerprint of its method, URL and body,
  and looked up in the node's call journal: an answer already paid for (by a crashed run) is rebuilt from
  the journal and the request is not sent;
* reserves one request and its estimated tokens from the endpoint's shared budget before it leaves (a
  429 closes that budget for everybody for a while: the whole deployment backs off);
* goes through the endpoint's shared breaker and the shared retry policy (``Retry-After`` respected,
  outage pauses shown on the pipeline); the SDK's own retries must be off (``max_retries=0``);
* is recorded in the ledger with the usage its answer reports, and its answer kept before the SDK sees
  it. A streamed answer (server-sent events) reaches the caller as it arrives and is kept once it ends;
  a replay gives it back as a stream.

The node (and its item) are read when the request is made, in the calling thread or task: one client may
serve every node and item of a process. Outside a recoverable node the transport only passes requests on.
The logic of one attempt is written once as steps (:mod:`recovery_ext._providers.steps`): the synchronous
transport runs them in the caller's thread; the asynchronous one runs every store call in a worker thread
and waits with ``asyncio.sleep``.

httpx is imported by the caller, never here: the classes are made for the module handed in (``httpx``, or
its fork ``httpx2`` that current OpenAI and Anthropic SDKs require).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import tenacity

from recovery_ext._classify.classifier import classify
from recovery_ext._providers.guard import AttemptHold, CircuitOpen, GuardedCall, ProviderGuard
from recovery_ext._providers.event_streams import _BrokenEvent, EventGate
from recovery_ext._providers.http_answers import (NO_USAGE, NOT_READ, RequestFacts, UnreadableAnswer, answered_call,
                                                  check_answer, check_event_stream, check_kept_answer,
                                                  decode_body, is_event_stream, kept_answer, request_facts,
                                                  stream_reached_end, undecodable_answer)
from recovery_ext._providers.journal import MISS
from recovery_ext._providers.budget import Reservation
from recovery_ext._providers.ledger import current_scope
from recovery_ext._providers.prices import Prices
from recovery_ext._providers.spend import SpendReservation
from recovery_ext._providers.steps import RETRY_STOPPED, Blocking, Io, Sleep, Steps, drive, drive_async, in_thread
from recovery_ext._store.models import BreakerDecision

# Hop-by-hop and body-framing headers: the answer handed on is the decoded body, framed anew.
FRAMING_HEADERS = ("content-encoding", "content-length", "transfer-encoding")

# The guard of a node for a request's URL (the Dagster layer binds it to the node); None: not guarded.
GuardFor = Callable[[Any, Any], "ProviderGuard | None"]
# What a streamed answer runs once it ends (the answer's bytes, the error that ended it): the finishing steps,
# returning the UnreadableAnswer the stream then raises to its reader.
Finish = Callable[..., Steps[UnreadableAnswer | None]]
# ``whole``: whether a stream's decoded bytes so far are its API's whole answer (see stream_reached_end)
Tee = Callable[[Any, Finish, Callable[[bytes], bool]], Any]


class JournalingCore:
    """What both transports share: the settings, and one attempt of a request as steps."""

    def __init__(self, http: ModuleType, guard_for: GuardFor, *, prices: Prices | None = None,
                 provider: str | None = None, answer_tokens: int = 1024, journal: bool = True) -> None:
        self.http = http
        self.guard_for = guard_for
        self.prices = prices or Prices.parse(None)
        self.provider = provider
        self.answer_tokens = answer_tokens
        self.journal = journal  # False: each request is budgeted, retried and recorded, its answer not kept

    def plan(self, request: Any) -> tuple[ProviderGuard, GuardedCall, RequestFacts] | None:
        """The guard and journal entry of ``request`` for the node (and item) of the calling thread or task;
        None outside a recoverable node."""
        scope = current_scope.get()
        journal = getattr(scope, "journal", None)
        if journal is None:
            return None
        guard = self.guard_for(journal.scope, request.url)
        if guard is None:
            return None
        journal.scope.check_calls()  # superseded, or its run worker gone: nothing leaves
        facts = request_facts(request.method, str(request.url), request.headers, request.content,
                              answer_tokens=self.answer_tokens)
        pending = journal.open(endpoint=guard.endpoint, key=facts.key if self.journal else None,
                               fingerprinted=facts.fingerprinted if self.journal else None)
        return guard, GuardedCall(estimated_tokens=facts.estimated_tokens, model=facts.model, pending=pending), facts

    def attempt(self, guard: ProviderGuard, call: GuardedCall, facts: RequestFacts, request: Any,
                send: Io, read: Callable[[Any], Io], tee: Tee) -> Steps[Any]:
        """One attempt: budget, breaker, journal, the request, its answer kept and recorded."""
        pending = call.pending
        assert pending is not None
        pending.journal.scope.check_calls()
        if guard.pause is not None:
            yield Blocking(guard.pause_retrying, (call,))
        # the request's ledger row is named now: its spend cap reservation names it, so that after a kill the
        # row's usage (if its answer was kept) settles the reservation
        call_id = uuid.uuid4().hex
        spend: SpendReservation | None = None
        waiting_since = guard.clock()
        if guard.spend is not None:  # the pipeline's spend caps first: at the cap the node pauses here
            spend = yield from guard.spend.acquire_steps(call.estimated_tokens, call.model, ref=call_id)
        reservation: Reservation | None = None
        try:
            if guard.budget is not None:
                reservation = yield from guard.budget.acquire_steps(call.estimated_tokens, call.model)
        except BaseException:
            if spend is not None:
                yield Blocking(spend.release)
            raise
        finally:
            guard.not_an_outage(call, waiting_since)
        hold = AttemptHold(reservation, spend, guard.log)
        try:
            decision = None
            if guard.store is not None:
                decision = yield Blocking(guard._breaker_decision, (guard.store,))
                if not decision.allowed:
                    raise CircuitOpen(guard.endpoint, decision.wait_seconds, decision.state)
            pending.journal.scope.check_calls()  # the budget wait may have been long
            # a kept answer no client can read (journaled before answers were checked) is asked again
            found = yield Blocking(functools.partial(pending.start, call_id=call_id,
                                                     check=functools.partial(check_kept_answer, guard.endpoint,
                                                                             facts.api_path)),
                                   (guard.endpoint, call.model))
        except BaseException:
            yield Blocking(hold.release)  # nothing was sent
            raise
        if found is not MISS:
            yield Blocking(hold.release)  # answered from the journal: nothing was sent
            return self.replayed(found, request)
        started = time.monotonic()
        try:
            response = yield send
            if response.status_code >= 400:  # refused: classified (and maybe retried) with its body read
                yield read(response)
                raise self.http.HTTPStatusError(f"{guard.endpoint} answered HTTP {response.status_code}",
                                                request=request, response=response)
            if is_event_stream(response.headers):
                finish = functools.partial(self.finish_steps, guard, call, decision, hold, response, started,
                                           facts=facts, stream=True)
                return tee(response, finish, functools.partial(stream_reached_end, api_path=facts.api_path))
            try:
                body = yield read(response)
            except self.http.DecodingError as exc:  # a corrupt gzip body: no client could read it either
                raise undecodable_answer(guard.endpoint, response.status_code, response.headers, b"", exc) from None
            # an answer the SDK could not read, or not its API's answer, is a failed attempt, never kept: kept,
            # every re-execution would replay it and fail the same way
            parsed = check_answer(guard.endpoint, facts.api_path, response.status_code, response.headers, body)
        except BaseException as exc:
            yield Blocking(self.failed, (guard, call, decision, hold, exc))
            raise
        yield from self.finish_steps(guard, call, decision, hold, response, started, body, None, parsed,
                                     facts=facts)
        return self.http.Response(response.status_code, headers=self.plain_headers(response.headers), content=body,
                                  extensions=response.extensions)

    def finish_steps(self, guard: ProviderGuard, call: GuardedCall, decision: BreakerDecision | None,
                     hold: AttemptHold, response: Any, started: float, body: bytes,
                     error: BaseException | None, parsed: Any = NOT_READ, *,
                     facts: RequestFacts, stream: bool = False) -> Steps[UnreadableAnswer | None]:
        """The answer is complete (``error`` None): recorded with its usage and kept; else the attempt failed.
        ``parsed``: the body, already read as JSON (it is not parsed twice); ``facts``: the request's (a stream is
        judged by its API's protocol, and by whether it asked for its usage). Returns the
        :class:`UnreadableAnswer` of a stream an event of which was cut off: a failed attempt, never kept (the
        stream raises it to the SDK reading it).

        A ``stream``'s end is also its call's end for the node's outage (the transport left it undecided when the
        headers came): a whole answer ends the outage, a cut-off one does not (before: the headers ended it, so a
        stream always cut off restarted the outage clock at each call and never gave up, paying each time)."""
        unreadable = yield from self._finish_answer(guard, call, decision, hold, response, started, body, error,
                                                   parsed, facts=facts)
        if stream:
            failure = unreadable if unreadable is not None else error
            if failure is None or (isinstance(failure, Exception) and not classify(failure).retryable):
                yield Blocking(guard.pause_after, (call, failure))  # answered, or refused for good
            else:  # cut off, or stopped: the outage (if any) goes on
                yield Blocking(guard.pause_stopped, (call,))
        return unreadable

    def _finish_answer(self, guard: ProviderGuard, call: GuardedCall, decision: BreakerDecision | None,
                       hold: AttemptHold, response: Any, started: float, body: bytes,
                       error: BaseException | None, parsed: Any, *,
                       facts: RequestFacts) -> Steps[UnreadableAnswer | None]:
        if error is not None:
            unreadable = None
            if isinstance(error, _BrokenEvent):  # held back: the SDK never saw it
                error = unreadable = UnreadableAnswer(guard.endpoint, response.status_code, "text/event-stream",
                                                      error.payload.encode("utf-8", "replace"), str(error)[:120])
            elif isinstance(error, self.http.DecodingError):  # a corrupt gzip stream: no client could read it either
                error = unreadable = undecodable_answer(guard.endpoint, response.status_code, response.headers,
                                                        body, error)
            yield Blocking(self.failed, (guard, call, decision, hold, error))
            return unreadable
        try:
            yield Blocking(self.answered, (guard, call, decision, hold, response, started, body, parsed, facts))
        except UnreadableAnswer as unreadable:
            yield Blocking(self.failed, (guard, call, decision, hold, unreadable))
            return unreadable
        return None

    def answered(self, guard: ProviderGuard, call: GuardedCall, decision: BreakerDecision | None,
                 hold: AttemptHold, response: Any, started: float, body: bytes, parsed: Any,
                 facts: RequestFacts) -> None:
        pending = call.pending
        assert pending is not None
        streamed = is_event_stream(response.headers)
        if streamed:  # before anything is recorded: an event cut off makes it a failed attempt
            check_event_stream(guard.endpoint, response.status_code, body, facts.api_path)
        asked = facts.usage_asked and streamed
        record = answered_call(guard.endpoint, call.model, body, streamed=streamed,
                               latency=time.monotonic() - started, prices=self.prices, provider=self.provider,
                               parsed=parsed, estimate=(facts.estimated_tokens - facts.answer_bound,
                                                        facts.answer_bound) if asked else None)
        try:
            pending.journal.scope.record_call(record)  # completes the attempt's ledger row with the usage
            if record.note == NO_USAGE:  # nothing says what it cost: a spend cap counts it at its estimate
                hold.answered_without_usage()
            else:
                hold.settle(record.tokens_in + record.tokens_out, record.cost)
            pending.answered(kept_answer(response.status_code, response.headers, body))
        finally:
            if hold.rate is not None:
                guard._answered(hold.rate)
        guard.succeeded(decision)

    def failed(self, guard: ProviderGuard, call: GuardedCall, decision: BreakerDecision | None,
               hold: AttemptHold, exc: BaseException) -> None:
        assert call.pending is not None
        hold.spent_unknown(exc)  # a timeout may have been charged: counted at its estimate; a refusal gives it back
        call.pending.failed(exc)
        if hold.rate is not None:
            guard._answered(hold.rate)
        if not isinstance(exc, Exception):
            return
        guard.failed(exc, decision, call.model)

    def stream_parts(self, response: Any) -> tuple[list[tuple[str, str]], str | None]:
        """The headers a streamed answer goes on with, and its content encoding (None: none). An encoded stream
        is decoded as it is teed, so that a corrupt one fails its attempt as an unreadable answer (the SDK would
        raise a decoding error no policy retries) and what is kept is its text: it goes on without its encoding
        and framing headers."""
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding in ("", "identity"):
            return response.headers.multi_items(), None
        return self.plain_headers(response.headers), encoding

    def replayed(self, kept: Any, request: Any) -> Any:
        """The journaled answer as a fresh response (a stream again, for a streamed one)."""
        return self.http.Response(kept["status"], headers=[tuple(pair) for pair in kept["headers"]],
                                  content=decode_body(kept["body"]), request=request)

    @staticmethod
    def plain_headers(headers: Any) -> list[tuple[str, str]]:
        return [(name, value) for name, value in headers.multi_items() if name.lower() not in FRAMING_HEADERS]

    def refused(self, exc: BaseException) -> Any | None:
        """The provider's own refusal behind ``exc`` (given up on, or permanent), for the SDK to raise as it
        does; None: not an answer (a connection error, a stop), raised as it is."""
        current: BaseException | None = exc
        for _ in range(8):
            if current is None:
                return None
            if isinstance(current, self.http.HTTPStatusError):
                response = current.response
                return self.http.Response(response.status_code, headers=self.plain_headers(response.headers),
                                          content=response.content, request=current.request)
            current = current.__cause__
        return None


def _sync_classes(http: ModuleType) -> type:
    class RawChunks(http.SyncByteStream):  # type: ignore[name-defined,misc]  # httpx, passed in (imported only when used)
        """A stream's raw chunks for httpx's decoder; the tee closes the stream itself."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __iter__(self) -> Iterator[bytes]:
            yield from self.inner

    class TeeStream(http.SyncByteStream):  # type: ignore[name-defined,misc]  # httpx, passed in (imported only when used)
        """The answer's chunks to the caller as they arrive; kept once the stream ends."""

        def __init__(self, inner: Any, finish: Finish, whole: Callable[[bytes], bool], encoding: str | None) -> None:
            self.inner, self.finish, self.whole, self.done = inner, finish, whole, False
            self.chunks: list[bytes] = []
            self.gate = EventGate()
            # an encoded stream is decoded by httpx's own decoders, chunk by chunk as it arrives
            self.chunks_left = iter(inner) if encoding is None else http.Response(
                200, headers=[("content-encoding", encoding)], stream=RawChunks(inner)).iter_bytes()

        def __iter__(self) -> Iterator[bytes]:
            try:
                for chunk in self.chunks_left:
                    self.chunks.append(chunk)
                    events = self.gate.feed(chunk)
                    if events:
                        yield events
            except BaseException as exc:
                error = self._stopped(exc)
                if error is exc:
                    raise
                if error is not None:  # a broken event, a corrupt encoding: retryable, as a cut-off answer
                    raise error from None
                rest = self.gate.rest()  # an error after the answer's end: the answer goes on whole
                if rest:
                    yield rest
                return
            unreadable = self._end(None)
            if unreadable is not None:  # to the SDK reading it: a retryable error, as a connection cut mid-answer
                raise unreadable
            rest = self.gate.rest()
            if rest:
                yield rest

        def _end(self, error: BaseException | None) -> UnreadableAnswer | None:
            if self.done:
                return None
            self.done = True
            return drive(self.finish(b"".join(self.chunks), error))

        def _stopped(self, exc: BaseException) -> BaseException | None:
            """``exc`` stopped the read. Its last event came first: whatever stopped it (a reset before the
            chunked body's end, a reader that gave up on the tail), the provider finished and billed the answer,
            and it is kept; an error then ends the stream cleanly (None), a stop goes on. Else the attempt failed:
            the error to raise."""
            if not _reached_end(self.whole, self.chunks):
                return self._end(exc) or exc
            if isinstance(exc, Exception):
                self._end(None)
                return None
            # the stop goes on whatever the store says: the attempt stays unsettled, as after a kill, and the
            # next owner settles it from the ledger
            with contextlib.suppress(Exception):
                self._end(None)
            return exc

        def close(self) -> None:
            # An SDK closes the stream once it has read the last event it wants: the rest is read here, so the
            # answer the provider finished (and billed) is kept.
            try:
                if not self.done:
                    try:
                        self.chunks.extend(self.chunks_left)
                    except BaseException as exc:
                        error = self._stopped(exc)
                        if error is exc:
                            raise
                        if error is not None:  # a corrupt encoding in the unread tail: retryable
                            raise error from None
                    self._end(None)
            finally:
                self.inner.close()

    class JournalingTransport(http.BaseTransport):  # type: ignore[name-defined,misc]  # httpx, passed in (imported only when used)
        """A synchronous httpx transport that journals, budgets, records and retries each provider request
        made inside a recoverable node (see :mod:`recovery_ext._providers.transport`)."""

        def __init__(self, core: JournalingCore, inner: Any = None) -> None:
            self.core = core
            self.inner = inner if inner is not None else http.HTTPTransport()

        def handle_request(self, request: Any) -> Any:
            request.read()
            planned = self.core.plan(request)
            if planned is None:
                return self.inner.handle_request(request)
            guard, call, facts = planned
            send = Io(lambda: self.inner.handle_request(request), None)

            def tee(response: Any, finish: Finish, whole: Callable[[bytes], bool]) -> Any:
                headers, encoding = self.core.stream_parts(response)
                return http.Response(response.status_code, headers=headers,
                                     stream=TeeStream(response.stream, finish, whole, encoding),
                                     extensions=response.extensions)

            def attempt() -> Any:
                return drive(self.core.attempt(guard, call, facts, request, send,
                                               lambda response: Io(response.read, None), tee))

            try:
                response = tenacity.Retrying(sleep=guard.sleep, **guard.strategies(call))(attempt)
            except BaseException as exc:
                guard.pause_after(call, exc)
                refused = self.core.refused(exc) if isinstance(exc, Exception) else None
                if refused is None:
                    raise
                return refused
            if not isinstance(response.stream, TeeStream):  # a stream's end decides (see finish_steps)
                guard.pause_after(call, None)
            return response

        def close(self) -> None:
            self.inner.close()

    JournalingTransport.tee_stream = TeeStream  # what a streamed answer is read through (tests drive it alone)
    return JournalingTransport


def _async_classes(http: ModuleType) -> type:
    import anyio  # httpx's own dependency: its asynchronous transports run on it

    class AsyncRawChunks(http.AsyncByteStream):  # type: ignore[name-defined,misc]  # httpx, passed in (imported only when used)
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> Any:
            async for chunk in self.inner:
                yield chunk

    class AsyncTeeStream(http.AsyncByteStream):  # type: ignore[name-defined,misc]  # httpx, passed in (imported only when used)
        def __init__(self, inner: Any, finish: Finish, whole: Callable[[bytes], bool], context: contextvars.Context,
                     encoding: str | None) -> None:
            self.inner, self.finish, self.whole, self.context, self.done = inner, finish, whole, context, False
            self.chunks: list[bytes] = []
            self.gate = EventGate()
            self.chunks_left = inner.__aiter__() if encoding is None else http.Response(
                200, headers=[("content-encoding", encoding)], stream=AsyncRawChunks(inner)).aiter_bytes()

        async def __aiter__(self) -> Any:
            try:
                async for chunk in self.chunks_left:
                    self.chunks.append(chunk)
                    events = self.gate.feed(chunk)
                    if events:
                        yield events
            except BaseException as exc:
                # as the synchronous stream does; a cancellation too: the OpenAI SDK reads the tail after
                # [DONE] for 0.1 s only, then cancels the read
                error = await self._stopped(exc)
                if error is exc:
                    raise
                if error is not None:
                    raise error from None
                rest = self.gate.rest()
                if rest:
                    yield rest
                return
            unreadable = await self._end(None)
            if unreadable is not None:  # to the SDK reading it, as the synchronous stream does
                raise unreadable
            rest = self.gate.rest()
            if rest:
                yield rest

        async def _end(self, error: BaseException | None) -> UnreadableAnswer | None:
            if self.done:
                return None
            self.done = True
            # shielded: a reader cancelled (a timeout around the SDK's read) still has its attempt recorded, and
            # a whole answer kept, before the cancellation goes on
            with anyio.CancelScope(shield=True):
                unreadable = await drive_async(self.finish(b"".join(self.chunks), error), self.context)
            return unreadable

        async def _stopped(self, exc: BaseException) -> BaseException | None:
            """As the synchronous stream's."""
            if not _reached_end(self.whole, self.chunks):
                return await self._end(exc) or exc
            if isinstance(exc, Exception):
                await self._end(None)
                return None
            with contextlib.suppress(Exception):  # as the synchronous stream's
                await self._end(None)
            return exc

        async def aclose(self) -> None:
            try:
                if not self.done:
                    try:
                        self.chunks.extend([chunk async for chunk in self.chunks_left])
                    except BaseException as exc:  # as the synchronous stream does
                        error = await self._stopped(exc)
                        if error is exc:
                            raise
                        if error is not None:
                            raise error from None
                    await self._end(None)
            finally:
                await self.inner.aclose()

    class AsyncJournalingTransport(http.AsyncBaseTransport):  # type: ignore[name-defined,misc]  # httpx, passed in (imported only when used)
        """The asynchronous twin of ``JournalingTransport``: every store call in a worker thread, every wait
        an ``asyncio.sleep``; the event loop is never held by the database."""

        def __init__(self, core: JournalingCore, inner: Any = None) -> None:
            self.core = core
            self.inner = inner if inner is not None else http.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            await request.aread()
            planned = self.core.plan(request)
            if planned is None:
                return await self.inner.handle_async_request(request)
            guard, call, facts = planned
            # one context for every store call of this request: the journal's attempt variable lives there
            context = contextvars.copy_context()
            send = Io(None, lambda: self.inner.handle_async_request(request))

            def tee(response: Any, finish: Finish, whole: Callable[[bytes], bool]) -> Any:
                headers, encoding = self.core.stream_parts(response)
                return http.Response(response.status_code, headers=headers,
                                     stream=AsyncTeeStream(response.stream, finish, whole, context, encoding),
                                     extensions=response.extensions)

            async def attempt() -> Any:
                return await drive_async(self.core.attempt(guard, call, facts, request, send,
                                                           lambda response: Io(None, response.aread), tee), context)

            def threaded(fn: Callable[..., Any]) -> Callable[..., Any]:
                async def run(retry_state: Any) -> Any:
                    return await in_thread(context, fn, retry_state)
                return run

            strategies = guard.strategies(call)
            for name in ("wait", "stop", "before_sleep", "retry_error_callback"):
                strategies[name] = threaded(strategies[name])

            async def sleep(seconds: float) -> None:
                await drive_async(_sleep_steps(seconds, guard), context)

            try:
                response: Any = await tenacity.AsyncRetrying(sleep=sleep, **strategies)(attempt)
            except BaseException as exc:
                if guard.pause is not None and guard.ends_outage(exc):
                    await in_thread(context, functools.partial(guard.pause_ended, call))
                elif guard.pause is not None:
                    # counted off in a worker thread, not awaited (the lock may be held through a write; a cancelled
                    # task may not wait): this task's before_sleep may still be running in one, and must not count
                    # it after this
                    asyncio.get_running_loop().run_in_executor(None, guard.pause_stopped, call)
                refused = self.core.refused(exc) if isinstance(exc, Exception) else None
                if refused is None:
                    raise
                return refused
            if guard.pause is not None and not isinstance(response.stream, AsyncTeeStream):  # see finish_steps
                await in_thread(context, functools.partial(guard.pause_ended, call))
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    AsyncJournalingTransport.tee_stream = AsyncTeeStream  # as the synchronous transport's
    return AsyncJournalingTransport


def _reached_end(whole: Callable[[bytes], bool], chunks: list[bytes]) -> bool:
    """The stream's bytes so far are its API's whole answer; False when the check itself fails (an event nested
    too deep to read): nothing then says the answer is whole, and the error in flight goes on unchanged."""
    try:
        return whole(b"".join(chunks))
    except Exception:  # noqa: BLE001 - see above
        return False


def _sleep_steps(seconds: float, guard: ProviderGuard) -> Steps[None]:
    yield Sleep(seconds, guard.shutdown, guard.check, RETRY_STOPPED)


@functools.cache
def transport_classes(http: ModuleType) -> tuple[type, type]:
    """The synchronous and asynchronous journaling transports for ``http`` (``httpx`` or ``httpx2``)."""
    return _sync_classes(http), _async_classes(http)
