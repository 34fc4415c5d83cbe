"""What a recoverable op's body gets: :class:`NodeContext` (Dagster's context plus items,
checkpoints, fenced transactions and progress) and :class:`Item`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from dagster import Failure, OpExecutionContext

from recovery_ext._store.fenced import FencedTransaction
from recovery_ext._settings import check_count, check_seconds
from recovery_ext._liveness.heartbeat import HeartbeatSettings, Lease
from recovery_ext._classify.redaction import redact
from recovery_ext._errors import StopRequested
from recovery_ext._providers.journal import CallJournal, current_attempt
from recovery_ext._providers.ledger import observe, recorder_for
from recovery_ext._store.models import ItemCheckpoint, JsonText, Ownership, ProviderCall, encode_json
from recovery_ext._dagster.queue_handle import QueueHandle
from recovery_ext._conventions import json_exact
from recovery_ext._dagster.resources import RecoveryResource
from recovery_ext._store.statuses import ItemOutcome, ItemStatus
from recovery_ext._store.interfaces import OpStore

log = logging.getLogger("recovery_ext._dagster.context")

def replayable_output(value: Any) -> Any:
    """Round-trip through JSON so the first run's downstream ops see exactly what a resume run replays."""
    try:
        return json_exact(value)
    except (TypeError, ValueError) as exc:
        raise Failure(
            description=f"a recoverable op's output must be JSON-serializable so resumes can replay it: {exc}",
            allow_retries=False,
        ) from exc


# The item outcomes every node reports, as output metadata ``items_<outcome>``.
ITEM_OUTCOMES = tuple(ItemOutcome)


def _json_text(result: Any) -> JsonText | None:
    """An item result as the JSON text its checkpoint stores (None stays None: no result)."""
    if result is None:
        return None
    try:
        return encode_json(result)
    except (TypeError, ValueError) as exc:
        raise Failure(description=f"an item result must be JSON-serializable so resumes can return it: {exc}",
                      allow_retries=False) from exc


@dataclass(slots=True)
class Item:
    """One unfinished sub-item; ``complete`` commits its result together with its checkpoint."""

    node: NodeContext
    key: str

    def complete(self, result: Any = None, *, also: Callable[[FencedTransaction], None] | None = None) -> None:
        """Checkpoint this item; ``also(tx)`` writes in the same fenced transaction."""
        self.node.checkpoint(self.key, result, also=also)

    def degrade(self, result: Any = None, *, also: Callable[[Any], None] | None = None) -> None:
        """Record a fallback answer: kept as the item's result, but ``degraded``, so the next run of this
        node (a crash resume or ``recovery-ext redo-degraded``) asks the provider again."""
        self.node.checkpoint(self.key, result, also=also, status=ItemStatus.DEGRADED)


class NodeContext:
    """What a recoverable op's body gets: Dagster's context plus items, progress and ownership checks.

    Writes go through :meth:`transaction` (or :meth:`write`, or ``item.complete(also=...)``):
    each is a transaction fenced by this worker's epoch, so a superseded worker's write is
    refused before it runs. Reads go through :meth:`read`, a transaction the database
    refuses to write in. The raw store is deliberately not part of this API.
    """

    def __init__(self, context: OpExecutionContext, store: OpStore, own: Ownership, node: str,
                 settings: HeartbeatSettings, watchdog: Lease | None, resource: RecoveryResource,
                 run_worker_gone: threading.Event | None = None) -> None:
        self.context = context
        self._store = store
        self.ownership = own
        self.node_name = node
        self.settings = settings
        self.watchdog = watchdog
        self.resource = resource
        # One vocabulary for every node's items (ops, assets and queue items alike), reported as
        # output metadata under these names: see ITEM_COUNTS.
        self.items_resumed = 0   # finished before this run (kept, not redone)
        self.items_done = 0      # finished by this run
        self.items_degraded = 0  # fallback answers recorded by this run (asked again by the next run)
        self.items_failed = 0    # failed in this run; a queue retries them later (or they failed for good)
        self.items_dead = 0      # queue items out of attempts in this run
        self.items_released = 0  # queue items a superseded run held, released by this run
        self._count_lock = threading.Lock()
        self.metadata: dict[str, Any] = {}
        self._batch = 1
        self._flush_seconds: float | None = None
        self._pending: dict[str, ItemCheckpoint] = {}  # by key: a key completed twice is found at once
        self._pending_since = 0.0
        # The provider ledger: calls recorded per item key (None: made outside any item), until the
        # checkpoint of that item (or the node's completion) takes them into its transaction.
        self._recorder = recorder_for(store)
        self._calls: dict[str | None, list[ProviderCall]] = {}
        self._calls_lock = threading.Lock()
        self._item: str | None = None
        self.calls_recorded = 0
        # Set in a step process once its run worker is gone: no new provider call or item may start.
        self.run_worker_gone = run_worker_gone
        # Provider answers kept before the body sees them, replayed to a resume (see journaled_call).
        self.journal = CallJournal(self, store)

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
        with self._store.pipelines.fenced(self.ownership) as tx:
            yield tx

    def check_calls(self) -> None:
        """Stop here, before a provider call or a new item, if this worker was superseded or its run worker died.

        A dead run worker does not stop a checkpoint (the epoch fence decides whether an answer already
        paid for is kept), only new work: the resume would pay for it again.
        """
        self.check()
        if self.run_worker_gone is not None and self.run_worker_gone.is_set():
            raise StopRequested("the run worker is gone: this step process starts no new provider call")

    def record_call(self, call: ProviderCall, *, item: Item | str | None = None) -> bool:
        """Record a provider call made for ``item`` (default: the item ``ctx.items()`` yielded last, else the
        node) in the ledger; its answer reached a checkpoint once that item's ``complete`` commits (or the
        node completes). Never raises: a call that cannot be recorded is logged, the work goes on.
        """
        attempt = current_attempt.get()
        if attempt is not None and attempt.scope is self and attempt.call is None and item is None:
            # the journaled request under way: this completes its ledger row (written before it left)
            bound = attempt.bind(call)
            with self._calls_lock:
                self._calls.setdefault(bound.item_key, []).append(bound)
                self.calls_recorded += 1
            observe(bound)
            return True
        try:
            if isinstance(item, Item):
                key: str | None = item.key
            elif item is not None:
                key = str(item)
            else:
                key = call.item_key if call.item_key is not None else self._item
            own = self.ownership
            bound = replace(call, pipeline_id=own.pipeline_id, node_name=self.node_name, item_key=key,
                            run_id=own.owner, epoch=own.epoch)
            with self._calls_lock:
                self._calls.setdefault(key, []).append(bound)
                self.calls_recorded += 1
            self._recorder.record(bound)
        except Exception as exc:  # noqa: BLE001 - recording a call must never fail the work
            log.warning("provider call not recorded: %s", redact(exc))
            return False
        observe(bound)  # the one place every call of a node passes (record_provider_call arrives here too)
        return True

    @property
    def current_item(self) -> str | None:
        """The key of the item ``ctx.items()`` yielded last (None: between items)."""
        return self._item

    def keep_call(self, call: ProviderCall) -> None:
        """A call already in the ledger whose answer this node uses: its item's checkpoint (or the node's
        completion) marks it as kept."""
        with self._calls_lock:
            self._calls.setdefault(call.item_key, []).append(call)

    def _take_calls(self, key: str | None) -> tuple[ProviderCall, ...]:
        with self._calls_lock:
            return tuple(self._calls.pop(key, ()))

    def flush_ledger(self) -> bool:
        """Write every recorded call no checkpoint took (best effort; they stay buffered if the database is away)."""
        return self._recorder.flush()

    def write(self, work: Callable[[FencedTransaction], Any]) -> Any:
        """``work(tx)`` in a fenced transaction, re-run as a whole on transient database errors."""
        self.check()
        return self._store.pipelines.write_fenced(self.ownership, work)

    def queue(self, name: str) -> QueueHandle:
        """The work queue ``name``: claims, item heartbeats, completions and failures fenced by this run's epoch."""
        return QueueHandle(self._store, self.ownership, name, on_count=self.count_items,
                           before_claim=self.check_calls)

    def count_items(self, outcome: str, number: int = 1) -> None:
        """Add ``number`` to ``items_<outcome>`` (thread-safe: queue workers count from their threads)."""
        if outcome not in ITEM_OUTCOMES:
            raise ValueError(f"unknown item outcome {outcome!r}; one of {', '.join(ITEM_OUTCOMES)}")
        with self._count_lock:
            setattr(self, f"items_{outcome}", getattr(self, f"items_{outcome}") + number)

    def item_counts(self) -> dict[str, int]:
        """The node's item counts, as its output metadata reports them."""
        return {f"items_{outcome}": getattr(self, f"items_{outcome}") for outcome in ITEM_OUTCOMES}

    @contextmanager
    def read(self) -> Iterator[Any]:
        """A read-only transaction (the database refuses writes in it)."""
        with self._store.read_only() as conn:
            yield conn

    def node_statuses(self) -> dict[str, str]:
        """Status of every node of this pipeline, by name."""
        return {n.name: n.status for n in self._store.pipelines.list_nodes(self.pipeline_id)}

    def progress(self) -> None:
        """The body moved forward: resets the stall timer (and checks ownership)."""
        self.check()
        if self.settings.stall_timeout:
            self._store.pipelines.report_progress(self.ownership, self.node_name,
                                                  stall_timeout=self.settings.stall_timeout)

    def completed_items(self) -> dict[str, Any]:
        return self._store.pipelines.completed_items(self.pipeline_id, self.node_name)

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
        statuses = self._store.pipelines.start_items(self.ownership, self.node_name, len(keys))
        done = {k for k, status in statuses.items() if status != ItemStatus.DEGRADED}
        self.count_items(ItemOutcome.RESUMED, sum(1 for k in keys if k in done))
        if self.items_resumed:
            self.log.info(f"resuming node {self.node_name}: {self.items_resumed}/{len(keys)} items already done")
        self._batch, self._flush_seconds = batch, flush_seconds
        try:
            for key in keys:
                if key in done:
                    continue
                self._flush_if_due()
                self.check_calls()
                self._item = key
                yield Item(self, key)
            self._item = None
            self.flush()
        finally:
            self._item = None
            self._batch, self._flush_seconds = 1, None

    def checkpoint(self, key: str, result: Any = None, *, also: Callable[[Any], None] | None = None,
                   status: str = ItemStatus.COMPLETED) -> None:
        self.check()
        key = str(key)
        # Encoded once, here: the store writes this text as it is (a batch of 1,000 items spends most of
        # its client time on per-item work, so none of it is done twice).
        entry = ItemCheckpoint(key, _json_text(result), status, also, self._take_calls(key))
        if self._batch > 1:
            if key in self._pending:
                raise Failure(description=f"item {key!r} of node {self.node_name} completed twice",
                              allow_retries=False)
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending[key] = entry
            self._flush_if_due()
            return
        self._store.pipelines.checkpoint_item(self.ownership, self.node_name, entry,
                                              stall_timeout=self.settings.stall_timeout)
        self._count([entry])

    def flush(self) -> None:
        """Commit the buffered completions of a batched ``items()`` loop now (one fenced transaction)."""
        if not self._pending:
            return
        self.check()
        pending = list(self._pending.values())
        self._pending = {}
        self._store.pipelines.checkpoint_items(self.ownership, self.node_name, pending,
                                     stall_timeout=self.settings.stall_timeout)
        self._count(pending)

    def _flush_if_due(self) -> None:
        if not self._pending:
            return
        waited = time.monotonic() - self._pending_since
        if len(self._pending) >= self._batch or (self._flush_seconds is not None and waited >= self._flush_seconds):
            self.flush()

    def _count(self, entries: list[ItemCheckpoint]) -> None:
        self._recorder.written(call for entry in entries for call in entry.calls)
        degraded = sum(1 for e in entries if e.status == ItemStatus.DEGRADED)
        self.count_items(ItemOutcome.DEGRADED, degraded)
        self.count_items(ItemOutcome.DONE, len(entries) - degraded)


def store_of(ctx: NodeContext) -> OpStore:
    """The store a node writes through, for the library's own helpers that take a node's context (a provider
    guard, a provider job): user code is not given it (see :class:`NodeContext`)."""
    return ctx._store
