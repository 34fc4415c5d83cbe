"""Group commit: the checkpoints of items that finish together commit together, in one fenced transaction.

Items worked in parallel (``ctx.map`` threads, ``ctx.amap`` tasks) each hand their checkpoint to one
:class:`GroupCommitter` per node and wait for its future. One writer thread takes every checkpoint
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
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put((entry, done))
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

    def _take(self) -> tuple[list[tuple[E, Future[Any]]], bool]:
        """The next batch: everything queued now (blocking for the first), and whether close was asked."""
        first = self._queue.get()
        if first is _CLOSE:
            return [], True
        batch = [first]
        deadline = time.monotonic() + self._max_wait
        closing = False
        while len(batch) < self._max_batch:
            try:
                left = deadline - time.monotonic()
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
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

    def _write(self, batch: list[tuple[E, Future[Any]]]) -> None:
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


def _settle(done: Future[Any], result: Any = None, *, error: BaseException | None = None) -> None:
    """Resolve ``done`` unless its waiter gave up on it: an asyncio task cancelled while it awaited its commit
    (``asyncio.wrap_future``) cancels the future too, and the writer must go on with the others."""
    try:
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)
    except InvalidStateError:
        pass
