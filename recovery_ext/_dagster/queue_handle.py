"""The work queue as op code sees it: ``ctx.queue(name)``, every write fenced by the run's epoch.

Op code never touches the store: each call here passes the node's ownership to the queue
store, which locks the pipeline row and checks the epoch inside the write's own transaction
(``_store/queue.py``). Items claimed here carry that epoch, and heartbeats, completions and failures
accept only items held for this very ownership, so an item claimed elsewhere (or with no
holder) cannot be used to write around the fence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from recovery_ext._errors import ItemTakenOver
from recovery_ext._store.models import Ownership, QueueItem
from recovery_ext._store.models import ResetItem
from recovery_ext._classify.retry import wait_jittered_exponential
from recovery_ext._store.interfaces import QueueHandleStore
from recovery_ext._store.statuses import ItemOutcome, QueueStatus


class QueueHandle:
    """One queue, bound to one node's ownership (pipeline id and epoch)."""

    def __init__(self, store: QueueHandleStore, own: Ownership, name: str, *,
                 on_count: Callable[[str, int], None] | None = None,
                 before_claim: Callable[[], None] | None = None) -> None:
        self._queue_store = store
        self._own = own
        self.name = name
        # A claim is new work: like a new item or a provider call, a step process whose run worker died (or
        # that was superseded) takes no more; what it holds it may still finish and keep.
        self._before_claim = before_claim or (lambda: None)
        # Counts outcomes into the node's item metadata (done, failed, dead, released), so a queue
        # node reports its documents in the same words as any node reports its items.
        self._count = on_count or (lambda outcome, number: None)

    # -- fenced writes ------------------------------------------------------------------------

    def enqueue(self, payloads: Iterable[Any], *, dedupe_keys: Sequence[str | None] | None = None,
                max_attempts: int = 3) -> list[int]:
        """Add items (an item whose dedupe key is already queued is not added again); the ids added."""
        return self._queue_store.queue.enqueue(self.name, payloads, dedupe_keys=dedupe_keys, max_attempts=max_attempts,
                                         own=self._own)

    def claim(self, worker: str, *, limit: int = 1, heartbeat_timeout: float = 600.0,
              legacy_stale_seconds: float | None = None) -> list[QueueItem]:
        """Take up to ``limit`` items for ``worker`` (stale ones first), held for this run's epoch. Raises
        ``StopRequested`` instead once this step's run worker is gone (``OwnershipLost`` once superseded)."""
        self._before_claim()
        return self._queue_store.queue.claim(self.name, worker, limit=limit, heartbeat_timeout=heartbeat_timeout,
                                       own=self._own, legacy_stale_seconds=legacy_stale_seconds)

    def heartbeat(self, item: QueueItem, *, timeout: float) -> None:
        self._queue_store.queue.heartbeat_item(self._held(item), timeout=timeout)

    def complete(self, item: QueueItem, result: Any = None) -> str:
        """Completed with its result; returns the status it came from (see ``Queue.complete_item``)."""
        came_from = self._queue_store.queue.complete_item(self._held(item), result)
        self._count(ItemOutcome.DONE, 1)
        return came_from

    def fail(self, item: QueueItem, error: str, *, retryable: bool = True,
             backoff: wait_jittered_exponential | None = None) -> str:
        """A failed attempt: ready again later, dead at max attempts, failed if permanent; the new status."""
        status = self._queue_store.queue.fail_item(self._held(item), error, retryable=retryable, backoff=backoff)
        self._count(ItemOutcome.DEAD if status == QueueStatus.DEAD else ItemOutcome.FAILED, 1)
        return status

    def release_superseded(self) -> list[ResetItem]:
        """Items held by any earlier epoch of this pipeline go back to ``ready``."""
        released = self._queue_store.queue.release_superseded(self._own, queue=self.name)
        self._count(ItemOutcome.RELEASED, len(released))
        return released

    def count_finished(self, ids: Sequence[int]) -> int:
        """Of ``ids``, those finished before now (kept, not redone), counted as the node's resumed items."""
        finished = len(set(ids)) - len(self.unfinished(list(set(ids))))
        self._count(ItemOutcome.RESUMED, finished)
        return finished

    # -- reads ----------------------------------------------------------------------------------

    def item_ids(self, dedupe_keys: Sequence[str]) -> list[int]:
        return self._queue_store.queue.item_ids(self.name, dedupe_keys)

    def unfinished(self, ids: Sequence[int]) -> list[QueueItem]:
        """Those of ``ids`` that still need work."""
        return self._queue_store.queue.unfinished_items(ids)

    def seconds_until_claimable(self) -> float | None:
        return self._queue_store.queue.seconds_until_claimable(self.name)

    def _held(self, item: QueueItem) -> QueueItem:
        """Only items claimed for this ownership: the store fences them by the holder's epoch."""
        if (item.queue, item.holder_pipeline_id, item.holder_epoch) != (self.name, self._own.pipeline_id,
                                                                       self._own.epoch):
            raise ItemTakenOver(
                f"queue item {item.id} is not held for pipeline {self._own.pipeline_id} epoch {self._own.epoch} "
                f"in queue {self.name!r}; claim it through this handle first", item_id=item.id)
        return item
