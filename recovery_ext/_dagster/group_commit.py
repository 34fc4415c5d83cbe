"""Group commit: the checkpoints of items that finish together commit together, in one fenced transaction.

Items worked in parallel (``ctx.map`` threads, ``ctx.amap`` tasks) each hand their checkpoint to one
:class:`GroupCommitter` per node and wait for its future (a thread that only blocks on it, as a journal write
does, for a lighter :class:`Waiter`). One writer thread takes every checkpoint
queued at that moment and commits them in ONE transaction fenced by the node's epoch; what arrives
while that commit runs goes into the next one. So 64 parallel items are one writer, never 64
competing ones (SQLite has one write lock), and a completion waits at most one commit's duration
(plus ``max_wait``, 0 by default) before its own commit starts: nobody waits for a batch to fill.

A batch the database refuses for one entry (a value it cannot store, an ``also`` write that raises) is
committed again one entry at a time, so only that entry fails; a refusal that concerns the node as a
whole (ownership lost, a stop, the database away) fails every entry of the batch.

The same writer batches the call journal's fenced writes of a node's items in flight (see
``CallJournal.batching``): there ``commit`` returns one result per entry (a journaled answer found, or
None), which its entry's future resolves to.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Generic, TypeVar

from recovery_ext._errors import OwnershipLost, StopRequested, StoreUnavailable

log = logging.getLogger("recovery_ext._dagster.group_commit")

# Refusals that concern the node, not one entry: committing the entries one by one would only repeat them.
NODE_WIDE = (OwnershipLost, StopRequested, StoreUnavailable)

_CLOSE = object()

E = TypeVar("E")


class Waiter:
    """One entry's commit, for a thread that blocks on it (``submit_waiting``): a lock taken when the entry is
    queued and released by the writer once it is settled. A :class:`Future` costs a condition, a lock per
    waiter and a notify per entry; with 64 items in flight making two journal writes and a checkpoint each,
    that was about 5 % of the GIL's time (py-spy --gil). It has no callbacks and cannot be cancelled: an item's
    checkpoint, tallied by a callback, and an asyncio task's wait keep their futures."""

    __slots__ = ("_done", "_result", "_error")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._result: Any = None
        self._error: BaseException | None = None

    def settle(self, result: Any = None, *, error: BaseException | None = None) -> None:
        """Called once, by the writer."""
        self._result, self._error = result, error
        self._done.release()

    def wait(self) -> None:
        with self._done:
            pass

    def result(self) -> Any:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._result


class GroupCommitter(Generic[E]):
    """One writer thread committing queued entries in batches through ``commit(entries)``.

    ``commit`` is the node's fenced batch write (``store.pipelines.checkpoint_items`` bound to its
    ownership, or the journal's ``journal_writes``); it returns None, or one result per entry (each
    entry's future resolves to its own; an exception as a result fails that entry alone).
    ``committed(entries)`` runs after each successful commit (counts, the ledger's bookkeeping).
    """

    def __init__(self, commit: Callable[[Sequence[E]], Sequence[Any] | None], *,
                 committed: Callable[[Sequence[E]], None] | None = None,
                 max_batch: int = 512, max_wait: float = 0.0, name: str = "rx-group-commit") -> None:
        self._commit = commit
        self._committed = committed
        self._max_batch = max_batch
        self._max_wait = max_wait
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._name = name
        self.commits = 0  # transactions committed (a batch retried entry by entry counts each)
        self.entries = 0  # entries committed

    def submit(self, entry: E) -> Future[Any]:
        """Queue ``entry``; the future resolves once it is committed (to its result, if ``commit`` returns
        results), or fails with the reason."""
        done: Future[Any] = Future()
        self._put(entry, done)
        return done

    def _put(self, entry: E, done: Future[Any] | Waiter) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put((entry, done))

    def submit_waiting(self, entry: E) -> Waiter:
        """:meth:`submit` for a thread that blocks on the commit (``.result()``)."""
        done = Waiter()
        self._put(entry, done)
        return done

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_CLOSE)
        if thread is not None:
            thread.join()

    def _take(self) -> tuple[list[tuple[E, Future[Any] | Waiter]], bool]:
        """The next batch: everything queued now (blocking for the first, then waiting ``max_wait`` once for
        more), and whether close was asked. One sleep, then a drain: a timed ``get`` per entry woke this thread
        for each one, and at 64 items in flight those wake-ups cost the GIL more than the commits."""
        first = self._queue.get()
        if first is _CLOSE:
            return [], True
        if self._max_wait > 0:
            time.sleep(self._max_wait)
        batch = [first]
        closing = False
        while len(batch) < self._max_batch:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is _CLOSE:
                closing = True
                break
            batch.append(nxt)
        return batch, closing  # type: ignore[return-value]

    def _run(self) -> None:
        while True:
            batch, closing = self._take()
            if batch:
                self._write(batch)
            if closing:
                return

    def _write(self, batch: list[tuple[E, Future[Any] | Waiter]]) -> None:
        entries = [entry for entry, _ in batch]
        try:
            results = self._commit(entries)
        except NODE_WIDE as exc:
            for _, done in batch:
                _settle(done, error=exc)
            return
        except BaseException as exc:  # noqa: BLE001 - one entry's refusal must not fail its siblings
            if len(batch) == 1:
                _settle(batch[0][1], error=exc)
                return
            log.debug("a batch of %d entries was refused; committing them one by one", len(batch))
            for one in batch:
                self._write([one])
            return
        self.commits += 1
        self.entries += len(entries)
        if self._committed is not None:
            try:
                self._committed(entries)
            except Exception as exc:  # noqa: BLE001 - bookkeeping after a durable commit never undoes it
                log.warning("after a group commit: %s", exc)
        for i, (_, done) in enumerate(batch):
            result = None if results is None else results[i]
            if isinstance(result, BaseException):  # that entry alone was refused (its fence, on PostgreSQL)
                _settle(done, error=result)
            else:
                _settle(done, result)


def _settle(done: Future[Any] | Waiter, result: Any = None, *, error: BaseException | None = None) -> None:
    """Resolve ``done`` unless its waiter gave up on it: an asyncio task cancelled while it awaited its commit
    (``asyncio.wrap_future``) cancels the future too, and the writer must go on with the others."""
    if isinstance(done, Waiter):
        done.settle(result, error=error)
        return
    try:
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)
    except InvalidStateError:
        pass
