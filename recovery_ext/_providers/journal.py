"""The call journal as a client sees it: an answer paid for once is never paid for again.

A journaled call is keyed by the node and item it is made for and a **call key**: a fingerprint of the
request (a stable hash of its JSON) or an explicit idempotency key, and its occurrence within the item
(the second identical request of an item is its own call). Before the request leaves, its ledger row
is written as in flight, fenced by the owner's epoch; once the answer arrives it is kept in the journal
and the row completed, fenced too, before the caller's code sees it. A resume that makes the same call
for an unfinished item gets the journaled answer without calling the provider, and the ledger counts
that call as saved. ``fresh=True`` asks the provider again (and keeps the new answer).

:func:`journaled_call` is the public way for any client; :class:`ProviderGuard` journals through the
same :class:`CallJournal` (see ``provider_guard``). Outside a recoverable node nothing is journaled.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import importlib
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol

from recovery_ext._classify.classifier import classify
from recovery_ext._classify.redaction import redact
from recovery_ext._errors import ConfigurationError, OwnershipLost
from recovery_ext._providers.ledger import current_scope
from recovery_ext._providers.send_starts import start_alone
from recovery_ext._store.interfaces import GuardStore
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import JournalHit, JournalWrite, Ownership, ProviderCall

log = logging.getLogger("recovery_ext._providers.journal")

MISS = object()  # no journaled answer: the request goes out


class JournalScope(Protocol):
    """What the journal needs of a node (``NodeContext``)."""

    node_name: str
    ownership: Ownership

    @property
    def current_item(self) -> str | None: ...

    def keep_call(self, call: ProviderCall) -> None: ...

    def record_call(self, call: ProviderCall, *, item: Any = None) -> bool: ...

    def check_calls(self) -> None: ...


class Waiting(Protocol):
    """A write queued by a thread that blocks until it is committed (``GroupCommitter.submit_waiting``)."""

    def result(self) -> Any: ...


class BatchWriter(Protocol):
    """A group commit of the journal's writes (``GroupCommitter`` over ``store.providers.journal_writes``): the
    future resolves to the write's result once its batch committed, fenced, or fails with the refusal."""

    def submit(self, entry: JournalWrite) -> Future[Any]: ...

    def submit_waiting(self, entry: JournalWrite) -> Waiting: ...


def fingerprint(*parts: Any) -> str | None:
    """A stable hash of ``parts`` as canonical JSON; None when a part is not a JSON value (no stable key)."""
    try:
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def function_fingerprint(endpoint: str, model: str | None, fn: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> str | None:
    """The request a guarded ``fn(*args, **kwargs)`` makes, as far as it shows: the function, its arguments and
    the values its closure holds. None (not journaled) when any of them is not a JSON value."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    cells = getattr(getattr(fn, "__func__", fn), "__closure__", None) or ()
    try:
        captured = [cell.cell_contents for cell in cells]
    except ValueError:  # an empty cell
        return None
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    where = None if code is None else f"{code.co_filename}:{code.co_firstlineno}"
    return fingerprint("fn", endpoint, model, name, where, list(args), kwargs, captured)


def encode_answer(value: Any) -> str | None:
    """The answer as the journal keeps it: a JSON value, or a pydantic model (an SDK's response) with its
    class. None: it cannot be kept (the call still goes into the ledger, it is just not replayable).

    Exactly as it was paid for, NUL, lone surrogates and NaN included: ASCII text (the escapes and NaN's token
    are ASCII) that both databases' text columns keep as it is, so a replay returns what the first call did.
    What the item then stores of it takes the agreed form (:func:`~recovery_ext._conventions.storable_json`)."""
    try:
        return json.dumps({"json": value}, separators=(",", ":"))
    except (TypeError, ValueError):
        pass
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        cls = type(value)
        try:
            return json.dumps({"model": f"{cls.__module__}:{cls.__qualname__}", "json": dump(mode="json")},
                              separators=(",", ":"))
        except (TypeError, ValueError):
            return None
    return None


def decode_answer(text: str) -> Any:
    data = json.loads(text)
    named = data.get("model")
    if named is None:
        return data["json"]
    module, _, qualname = named.partition(":")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    validate = getattr(cls, "model_validate", None)
    if not isinstance(cls, type) or validate is None:
        raise ConfigurationError(f"a journaled answer names {named}, which is not a pydantic model")
    return validate(data["json"])


@dataclass
class Attempt:
    """One request under way: its ledger row (written in flight) and what its client recorded of it."""

    scope: JournalScope
    call_id: str
    item_key: str | None
    started: float
    call: ProviderCall | None = None

    def bind(self, call: ProviderCall) -> ProviderCall:
        """The client's record of this request, as the ledger row it completes."""
        own = self.scope.ownership
        bound = replace(call, id=self.call_id, pipeline_id=own.pipeline_id, node_name=self.scope.node_name,
                        item_key=self.item_key, run_id=own.owner, epoch=own.epoch)
        self.call = bound
        return bound


# The attempt under way in this thread: ``record_provider_call`` completes its ledger row instead of adding one.
current_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("rx_attempt", default=None)


class PendingCall:
    """One journaled call across its attempts: the first looks the answer up, each writes its own ledger row."""

    def __init__(self, journal: CallJournal, call_key: str | None, item_key: str | None, fresh: bool) -> None:
        self.journal, self.call_key, self.item_key, self.fresh = journal, call_key, item_key, fresh
        self._looked = fresh or call_key is None
        self._attempt: Attempt | None = None
        self._token: contextvars.Token[Any] | None = None
        self.endpoint: str = ""
        self.model: str | None = None

    def start(self, endpoint: str, model: str | None, *, call_id: str | None = None,
              check: Callable[[Any], None] | None = None) -> Any:
        """Before a request: the journaled answer (first attempt only), or MISS once the request's ledger row is
        written in flight (under ``call_id``, when the caller chose it: a spend cap's reservation names it).
        Fenced: a superseded worker raises here and sends nothing. ``check`` raises for a journaled answer that
        must not be replayed: it is asked again."""
        write = self.begin_write(endpoint, model, call_id)
        return self.started(write, self.journal.write(write), check)

    def begin_write(self, endpoint: str, model: str | None, call_id: str | None = None) -> JournalWrite:
        """The begin ``start`` writes: this request's ledger row in flight, and the look-up on the first attempt."""
        scope = self.journal.scope
        own = scope.ownership
        self.endpoint, self.model = endpoint, model
        call = ProviderCall(endpoint=endpoint, model=model, outcome=IN_FLIGHT, pipeline_id=own.pipeline_id,
                            node_name=scope.node_name, item_key=self.item_key, run_id=own.owner, epoch=own.epoch)
        if call_id is not None:
            call = replace(call, id=call_id)
        lookup = not self._looked
        self._looked = True
        return JournalWrite(call, self.call_key if lookup else None)

    def started(self, write: JournalWrite, hit: JournalHit | None, check: Callable[[Any], None] | None = None) -> Any:
        """After the begin committed: the journaled answer it found, else MISS with this attempt under way."""
        if hit is not None:
            try:
                answer = decode_answer(hit.answer)
                if check is not None:
                    check(answer)
            except Exception as exc:  # noqa: BLE001 - an answer that no longer decodes is asked again
                log.warning("journaled answer not usable, asking again: %s", redact(exc))
                self.journal.write(replace(write, call_key=None))
            else:
                self.journal.scope.keep_call(hit.call)  # its checkpoint marks the paid call as kept: saved by resume
                return answer
        self._attempt = Attempt(self.journal.scope, write.call.id, self.item_key, time.monotonic())
        self._token = current_attempt.set(self._attempt)
        return MISS

    def _end(self, outcome: str, note: str | None = None) -> ProviderCall:
        attempt = self._attempt
        assert attempt is not None, "start() first"
        if self._token is not None:
            current_attempt.reset(self._token)
            self._token = None
        self._attempt = None
        if attempt.call is not None:
            return attempt.call
        call = attempt.bind(ProviderCall(endpoint=self.endpoint, model=self.model, outcome=outcome,
                                         latency_seconds=time.monotonic() - attempt.started,
                                         note=note if isinstance(note, str) else None))
        if outcome == "ok":
            self.journal.scope.keep_call(call)
        return call

    def answered(self, result: Any) -> None:
        """The answer arrived: journaled and its ledger row completed (fenced) before the caller sees it. A
        superseded worker's answer completes the ledger row only, and OwnershipLost is raised."""
        write = self.answer_write(result)
        try:
            self.journal.write(write)
        except OwnershipLost:
            self.journal.store.providers.complete_calls([write.call])
            raise

    def answer_write(self, result: Any) -> JournalWrite:
        """The write ``answered`` makes: the answer kept under the call key, the ledger row completed."""
        call = self._end("ok")
        return JournalWrite(call, self.call_key, answered=True,
                            answer=None if self.call_key is None else encode_answer(result))

    def failed(self, exc: BaseException) -> None:
        """The request failed (or its answer was refused): the ledger row says how. Interrupted (a signal, an
        exit) the row stays in flight: whether the provider answered is unknown. Never raises."""
        if not isinstance(exc, Exception):
            if self._token is not None:
                current_attempt.reset(self._token)
                self._token = None
            self._attempt = None
            return
        # an error may name its own outcome and note (UnreadableAnswer: unreadable_result, the body's start)
        outcome = getattr(exc, "ledger_outcome", None)
        call = self._end(outcome if isinstance(outcome, str) else classify(exc).category,
                         note=getattr(exc, "ledger_note", None))
        try:
            self.journal.store.providers.complete_calls([call])
        except Exception as err:  # noqa: BLE001 - the caller's error is what matters; the row stays in flight
            log.warning("could not complete a failed call in the ledger: %s", redact(err))


class CallJournal:
    """The journal of one node (``scope``), written through ``store``: numbers each call key's occurrences per
    item."""

    def __init__(self, scope: JournalScope, store: GuardStore) -> None:
        self.scope = scope
        self.store = store
        # per item: how many times each call key was asked in this attempt at the item
        self._seen: dict[str | None, dict[str, int]] = {}
        self._lock = threading.Lock()
        # The group commits of the maps under way (the newest is used): while items run in parallel their begins
        # and answers commit together, a few fenced transactions for all of them (see group_commit).
        self._writers: list[BatchWriter] = []

    def attach(self, writer: BatchWriter) -> None:
        """Commit this node's journal writes through ``writer`` until :meth:`detach`."""
        with self._lock:
            self._writers.append(writer)

    def detach(self, writer: BatchWriter) -> None:
        with self._lock:
            self._writers.remove(writer)

    def submit(self, write: JournalWrite) -> Future[Any] | None:
        """``write`` handed to the group commit under way (its future), or None: there is none, it is written
        by the caller."""
        writers = self._writers
        if not writers:
            return None
        try:
            return writers[-1].submit(write)
        except RuntimeError:  # the map that attached it just ended: written alone
            return None

    def write(self, write: JournalWrite) -> JournalHit | None:
        """``write`` committed, fenced: with the other items' writes when a map is under way, else alone."""
        writers = self._writers
        if writers:
            try:
                batched = writers[-1].submit_waiting(write)
            except RuntimeError:  # the map that attached it just ended: written alone
                pass
            else:
                hit: JournalHit | None = batched.result()
                return hit
        providers, own = self.store.providers, self.scope.ownership
        if write.answered:
            providers.journal_answer(own, write.call, call_key=write.call_key, answer=write.answer)
            return None
        return providers.journal_begin(own, write.call, call_key=write.call_key)

    async def awrite(self, write: JournalWrite) -> JournalHit | None:
        """:meth:`write` for a task: awaits the group commit (no thread held), else writes in a worker thread."""
        batched = self.submit(write)
        if batched is not None:
            return await asyncio.wrap_future(batched)
        return await asyncio.to_thread(self.write, write)

    def restart_item(self, item_key: str | None) -> None:
        """The item starts over (an item retry, or it finished): its calls count from one again, so a retry
        asks its journaled calls under the same keys and gets the answers already paid for."""
        with self._lock:
            self._seen.pop(item_key, None)

    def open(self, *, endpoint: str, request: Any = None, key: str | None = None, fresh: bool = False,
             item: Any = None, fingerprinted: str | None = None) -> PendingCall:
        """A call about to be made: keyed by ``key``, else by ``request``'s fingerprint (or ``fingerprinted``);
        neither: journaled in the ledger only (the answer is not kept)."""
        item_key = str(getattr(item, "key", item)) if item is not None else self.scope.current_item
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 200):
            raise ConfigurationError(f"an idempotency key must be a string of 1 to 200 characters, got {key!r}")
        for what, text in (("item key", item_key), ("idempotency key", key)):
            why = None if text is None else self.store.dialect.why_unstorable(text)
            if text is not None and why is not None:  # before the request, as ctx.items refuses it: nothing sent
                raise ConfigurationError(f"a journaled call's {what} {text[:80]!r} {why}; the journal could not "
                                         "store it, so no request was sent (give it a short key of plain text)")
        if key is not None:
            base: str | None = "key:" + key
        elif request is not None:
            base = fingerprint("request", endpoint, request)
            if base is None:
                raise ConfigurationError("request= must be a JSON value (it is hashed to key the journal)")
        else:
            base = fingerprinted
        call_key = None
        if base is not None:
            with self._lock:
                seen = self._seen.setdefault(item_key, {})
                n = seen[base] = seen.get(base, 0) + 1
            call_key = f"{base}#{n}"
        return PendingCall(self, call_key, item_key, fresh)


def journaled_call(send: Callable[[], Any], *, endpoint: str, model: str | None = None, request: Any = None,
                   key: str | None = None, fresh: bool = False, item: Any = None) -> Any:
    """``send()`` once, its answer journaled: a resume that makes the same call for an unfinished item gets the
    answer back without calling the provider.

    ``request`` (any JSON value: the body you send) or ``key`` (your own idempotency key) says which call
    it is; ``fresh=True`` asks again. ``send`` returns the answer the caller uses, a JSON value or a
    pydantic model, and may record its usage with ``record_provider_call`` (it completes this call's
    ledger row). Outside a recoverable node this is just ``send()``.
    """
    scope = current_scope.get()
    journal = getattr(scope, "journal", None)
    if journal is None:
        return send()
    journal.scope.check_calls()  # the node the journal belongs to is this scope
    pending = journal.open(endpoint=endpoint, request=request, key=key, fresh=fresh, item=item)
    found = pending.start(endpoint, model)
    if found is not MISS:
        return found
    try:
        answer = send()
    except BaseException as exc:
        pending.failed(exc)
        raise
    pending.answered(answer)
    return answer


async def ajournaled_call(send: Callable[[], Awaitable[Any]], *, endpoint: str, model: str | None = None,
                          request: Any = None, key: str | None = None, fresh: bool = False, item: Any = None) -> Any:
    """:func:`journaled_call` for async code: ``await send()`` once, its answer journaled.

    The journal's reads and writes run in a worker thread (with this task's context), so the event loop
    goes on while they commit; the item is this task's (``ctx.amap`` sets it per task).
    """
    scope = current_scope.get()
    journal = getattr(scope, "journal", None)
    if journal is None:
        return await send()
    journal.scope.check_calls()
    pending = journal.open(endpoint=endpoint, request=request, key=key, fresh=fresh, item=item)
    begin = pending.begin_write(endpoint, model)
    hit = await journal.awrite(begin)
    if hit is not None:  # a resume's journaled answer (decoding it may write again: off the event loop)
        found = await asyncio.to_thread(contextvars.copy_context().run, pending.started, begin, hit)
        if found is not MISS:
            return found
        pending._token = None  # started() set the attempt in the worker thread's context; this task sets its own
        token = current_attempt.set(pending._attempt)  # record_provider_call in send() completes this row
    else:
        pending.started(begin, None)  # no hit, no store call: the attempt is set in this task's context
        token, pending._token = pending._token, None
    assert token is not None
    try:
        answer = await start_alone(send)  # the tasks one commit released start their requests one at a time
    except BaseException as exc:
        current_attempt.reset(token)
        if isinstance(exc, Exception):
            await asyncio.to_thread(pending.failed, exc)
        else:  # cancelled or interrupted: the row stays in flight (whether the provider answered is unknown)
            pending.failed(exc)
        raise
    current_attempt.reset(token)
    write = pending.answer_write(answer)
    try:
        await journal.awrite(write)
    except OwnershipLost:
        await asyncio.to_thread(journal.store.providers.complete_calls, [write.call])
        raise
    return answer
