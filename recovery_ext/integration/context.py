"""What a recoverable op's body gets: :class:`NodeContext` (Dagster's context plus items,
checkpoints, fenced transactions and progress) and :class:`Item`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dagster import Failure, OpExecutionContext

from ..fenced import FencedTransaction
from ..env import check_count, check_seconds
from ..heartbeat import HeartbeatSettings, Lease
from ..models import ItemCheckpoint, Ownership
from ..store import RecoveryStore
from .queue_handle import QueueHandle
from .resources import RecoveryResource


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so the first run's downstream ops see exactly what a resume run replays."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise Failure(
            description=f"a recoverable op's output must be JSON-serializable so resumes can replay it: {exc}",
            allow_retries=False,
        ) from exc


@dataclass
class Item:
    """One unfinished sub-item; ``complete`` commits its result together with its checkpoint."""

    node: "NodeContext"
    key: str

    def complete(self, result: Any = None, *, also: Callable[[FencedTransaction], None] | None = None) -> None:
        """Checkpoint this item; ``also(tx)`` writes in the same fenced transaction."""
        self.node.checkpoint(self.key, result, also=also)

    def degrade(self, result: Any = None, *, also: Callable[[Any], None] | None = None) -> None:
        """Record a fallback answer: kept as the item's result, but ``degraded``, so the next run of this
        node (a crash resume or ``recovery-ext redo-degraded``) asks the provider again."""
        self.node.checkpoint(self.key, result, also=also, status="degraded")


class NodeContext:
    """What a recoverable op's body gets: Dagster's context plus items, progress and ownership checks.

    Writes go through :meth:`transaction` (or :meth:`write`, or ``item.complete(also=...)``):
    each is a transaction fenced by this worker's epoch, so a superseded worker's write is
    refused before it runs. Reads go through :meth:`read`, a transaction the database
    refuses to write in. The raw store is deliberately not part of this API.
    """

    def __init__(self, context: OpExecutionContext, store: RecoveryStore, own: Ownership, node: str,
                 settings: HeartbeatSettings, watchdog: Lease | None, resource: RecoveryResource) -> None:
        self.context = context
        self._store = store
        self.ownership = own
        self.node_name = node
        self.settings = settings
        self.watchdog = watchdog
        self.resource = resource
        self.items_resumed = 0
        self.items_done = 0
        self.items_degraded = 0
        self.metadata: dict[str, Any] = {}
        self._batch = 1
        self._flush_seconds: float | None = None
        self._pending: list[ItemCheckpoint] = []
        self._pending_since = 0.0

    @property
    def log(self):
        return self.context.log

    @property
    def op_config(self) -> Any:
        return self.context.op_config

    @property
    def pipeline_id(self) -> int:
        return self.ownership.pipeline_id

    @property
    def store(self) -> Any:
        raise AttributeError("ctx.store is not part of the op API: write through `with ctx.transaction() as tx:` "
                             "(fenced by this run's ownership) and read through `with ctx.read() as conn:`")

    def check(self) -> None:
        """Stop here if this worker was superseded."""
        if self.watchdog is not None:
            self.watchdog.check()

    @contextmanager
    def transaction(self) -> Iterator[FencedTransaction]:
        """A write transaction fenced by this worker's epoch: ``with ctx.transaction() as tx: tx.upsert(...)``.

        The pipeline row is locked and the epoch checked inside the transaction before the
        first statement, so after a reclaim it raises ``OwnershipLost`` and writes nothing.
        """
        self.check()
        with self._store.fenced(self.ownership) as tx:
            yield tx

    def write(self, work: Callable[[FencedTransaction], Any]) -> Any:
        """``work(tx)`` in a fenced transaction, re-run as a whole on transient database errors."""
        self.check()
        return self._store.write_fenced(self.ownership, work)

    def queue(self, name: str) -> QueueHandle:
        """The work queue ``name``: claims, item heartbeats, completions and failures fenced by this run's epoch."""
        return QueueHandle(self._store, self.ownership, name)

    @contextmanager
    def read(self) -> Iterator[Any]:
        """A read-only transaction (the database refuses writes in it)."""
        with self._store.read_only() as conn:
            yield conn

    def node_statuses(self) -> dict[str, str]:
        """Status of every node of this pipeline, by name."""
        return {n.name: n.status for n in self._store.list_nodes(self.pipeline_id)}

    def progress(self) -> None:
        """The body moved forward: resets the stall timer (and checks ownership)."""
        self.check()
        if self.settings.stall_timeout:
            self._store.report_progress(self.ownership, self.node_name, stall_timeout=self.settings.stall_timeout)

    def completed_items(self) -> dict[str, Any]:
        return self._store.completed_items(self.pipeline_id, self.node_name)

    def items(self, keys: Iterable[str], *, batch: int = 1, flush_seconds: float | None = None) -> Iterator[Item]:
        """Yield only the items a previous run did not finish, in the given order; degraded items
        (fallback answers) count as unfinished and are asked again.

        ``batch=1`` (the default): every ``item.complete`` commits at once, for items that take
        seconds each (LLM, OCR). ``batch=N``: completions are buffered and their results,
        ``also=`` writes and checkpoints commit together in one fenced transaction once N are
        buffered, once the oldest buffered one has waited ``flush_seconds`` (checked at each
        completion and each next item), when the keys run out, and when the op body returns.
        A crash redoes at most the unflushed batch; ``also`` runs at the flush, so it must
        capture what it writes.
        """
        check_count("ctx.items(batch=...)", batch, minimum=1)
        if flush_seconds is not None:
            check_seconds("ctx.items(flush_seconds=...)", flush_seconds, minimum=0.0)
        keys = list(dict.fromkeys(str(k) for k in keys))  # a key given twice is one item (and counts once)
        statuses = self._store.start_items(self.ownership, self.node_name, len(keys))
        done = {k for k, status in statuses.items() if status != "degraded"}
        self.items_resumed = sum(1 for k in keys if k in done)
        if self.items_resumed:
            self.log.info(f"resuming node {self.node_name}: {self.items_resumed}/{len(keys)} items already done")
        self._batch, self._flush_seconds = batch, flush_seconds
        try:
            for key in keys:
                if key in done:
                    continue
                self._flush_if_due()
                self.check()
                yield Item(self, key)
            self.flush()
        finally:
            self._batch, self._flush_seconds = 1, None

    def checkpoint(self, key: str, result: Any = None, *, also: Callable[[Any], None] | None = None,
                   status: str = "completed") -> None:
        self.check()
        entry = ItemCheckpoint(str(key), _jsonable(result), status, also)
        if self._batch > 1:
            if any(pending.key == entry.key for pending in self._pending):
                raise Failure(description=f"item {entry.key!r} of node {self.node_name} completed twice",
                              allow_retries=False)
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(entry)
            self._flush_if_due()
            return
        self._store.checkpoint_item(self.ownership, self.node_name, entry.key, entry.result, also=also,
                                    stall_timeout=self.settings.stall_timeout, status=status)
        self._count([entry])

    def flush(self) -> None:
        """Commit the buffered completions of a batched ``items()`` loop now (one fenced transaction)."""
        if not self._pending:
            return
        self.check()
        pending, self._pending = self._pending, []
        self._store.checkpoint_items(self.ownership, self.node_name, pending,
                                     stall_timeout=self.settings.stall_timeout)
        self._count(pending)

    def discard_pending(self) -> int:
        """Forget unflushed completions (the body failed: they are redone by the next run)."""
        count, self._pending = len(self._pending), []
        return count

    def _flush_if_due(self) -> None:
        if not self._pending:
            return
        waited = time.monotonic() - self._pending_since
        if len(self._pending) >= self._batch or (self._flush_seconds is not None and waited >= self._flush_seconds):
            self.flush()

    def _count(self, entries: list[ItemCheckpoint]) -> None:
        degraded = sum(1 for e in entries if e.status == "degraded")
        self.items_degraded += degraded
        self.items_done += len(entries) - degraded
