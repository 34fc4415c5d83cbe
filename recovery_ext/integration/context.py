"""What a recoverable op's body gets: :class:`NodeContext` (Dagster's context plus items,
checkpoints, fenced transactions and progress) and :class:`Item`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dagster import Failure, OpExecutionContext

from ..fenced import FencedTransaction
from ..heartbeat import HeartbeatSettings, Lease
from ..models import Ownership
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

    def items(self, keys: Iterable[str]) -> Iterator[Item]:
        """Yield only the items a previous run did not finish, in the given order; degraded items
        (fallback answers) count as unfinished and are asked again."""
        keys = [str(k) for k in keys]
        self._store.set_items_total(self.ownership, self.node_name, len(keys))
        statuses = self._store.item_statuses(self.pipeline_id, self.node_name)
        done = {k for k, status in statuses.items() if status != "degraded"}
        self.items_resumed = sum(1 for k in keys if k in done)
        if self.items_resumed:
            self.log.info(f"resuming node {self.node_name}: {self.items_resumed}/{len(keys)} items already done")
        for key in keys:
            if key in done:
                continue
            self.check()
            yield Item(self, key)

    def checkpoint(self, key: str, result: Any = None, *, also: Callable[[Any], None] | None = None,
                   status: str = "completed") -> None:
        self.check()
        self._store.checkpoint_item(self.ownership, self.node_name, str(key), _jsonable(result), also=also,
                                    stall_timeout=self.settings.stall_timeout, status=status)
        if status == "degraded":
            self.items_degraded += 1
        else:
            self.items_done += 1
