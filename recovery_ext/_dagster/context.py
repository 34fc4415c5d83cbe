"""What a recoverable op's body gets: :class:`NodeContext` (Dagster's context plus items,
checkpoints, fenced transactions and progress) and :class:`Item`."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from dagster import Failure, OpExecutionContext

from recovery_ext._store.models import FencedTransaction
from recovery_ext._settings import check_count, check_seconds
from recovery_ext._liveness.heartbeat import HeartbeatSettings, Lease
from recovery_ext._classify.redaction import redact
from recovery_ext._errors import ConfigurationError, StopRequested
from recovery_ext._providers.journal import CallJournal, current_attempt
from recovery_ext._providers.ledger import CallRecorder, observe, recorder_for
from recovery_ext._store.models import ItemCheckpoint, JournalHit, JournalWrite, JsonText, Ownership, ProviderCall
from recovery_ext._dagster.group_commit import GroupCommitter
from recovery_ext._dagster.parallel import MapResult, map_in_tasks, map_in_threads, unique_keys
from recovery_ext._dagster.queue_handle import QueueHandle
from recovery_ext._conventions import agreed_json, storable_json
from recovery_ext._dagster.resources import RecoveryResource
from recovery_ext._dagster.run_state import ProgressReporter
from recovery_ext._store.statuses import ItemOutcome, ItemStatus
from recovery_ext._store.interfaces import OpStore

log = logging.getLogger("recovery_ext._dagster.context")

# The item the current thread or task works on, with the node it belongs to. A context variable, not a
# slot on the node: items worked in parallel (ctx.map threads, ctx.amap tasks, tasks the body creates)
# each see their own, so every provider call, journal entry and ledger row goes to the item it was made for.
current_item: contextvars.ContextVar[tuple[NodeContext, str] | None] = contextvars.ContextVar(
    "rx_current_item", default=None)

def replayable_output(value: Any) -> Any:
    """Round-trip through JSON so the first run's downstream ops see exactly what a resume run replays."""
    try:
        return agreed_json(value)
    except (TypeError, ValueError) as exc:
        raise Failure(
            description=f"a recoverable op's output must be JSON-serializable so resumes can replay it: {exc}",
            allow_retries=False,
        ) from exc


# The item outcomes every node reports, as output metadata ``items_<outcome>``.
ITEM_OUTCOMES = tuple(ItemOutcome)
_COUNTERS: dict[str, str] = {outcome: f"items_{outcome}" for outcome in ITEM_OUTCOMES}  # attribute names, made once
_STATUS = attrgetter("status")  # an item checkpoint's status, read for a whole batch at C speed


def _json_text(result: Any) -> JsonText | None:
    """An item result as the JSON text its checkpoint stores (None stays None: no result)."""
    if result is None:
        return None
    try:
        return JsonText(storable_json(result))  # encode_json's body: ctx.items(batch=N) runs this once per item
    except (TypeError, ValueError) as exc:
        raise Failure(description=f"an item result must be JSON-serializable so resumes can return it: {exc}",
                      allow_retries=False) from exc


def _refuse_unstorable_keys(name: str, keys: Sequence[str], dialect: Any, *,
                            outcome: str = "no item was started") -> None:
    """Refuse the keys whole (before any work is paid for) when one cannot be stored as text on this database
    (``dialect.first_unstorable``: a lone surrogate; a NUL where the database's text refuses one, so SQLite's
    pipelines that hold such keys still resume; a key longer than the database's index entries hold). Found only
    after its work, such a key's checkpoint would fail the op with the answer paid for. ``outcome`` says what was
    not done (``ctx.checkpoint(key)`` gets its key only after the work, so it refuses it there, before the
    store)."""
    unstorable = dialect.first_unstorable(keys)
    if unstorable is not None:
        key, why = unstorable
        raise ConfigurationError(f"{name}: key {key[:80]!r} {why}; a checkpoint could not store it, so "
                                 f"{outcome} (give each item a short key of plain text)")


@dataclass(slots=True)
class Item:
    """One unfinished sub-item; ``complete`` commits its result together with its checkpoint.

    An item of ``ctx.map``/``ctx.amap``/``ctx.aitems`` checkpoints through its node's group commit (with
    the completions of its siblings, in one fenced transaction); ``await item.acomplete(...)`` is the
    same without blocking the event loop.
    """

    node: NodeContext
    key: str
    committer: GroupCommitter[ItemCheckpoint] | None = None
    finished: bool = False

    def complete(self, result: Any = None, *, also: Callable[[FencedTransaction], None] | None = None) -> None:
        """Checkpoint this item; ``also(tx)`` writes in the same fenced transaction."""
        self._finish(result, also, ItemStatus.COMPLETED)

    def degrade(self, result: Any = None, *, also: Callable[[Any], None] | None = None) -> None:
        """Record a fallback answer: kept as the item's result, but ``degraded``, so the next run of this
        node (a crash resume or ``recovery-ext redo-degraded``) asks the provider again."""
        self._finish(result, also, ItemStatus.DEGRADED)

    async def acomplete(self, result: Any = None, *, also: Callable[[FencedTransaction], None] | None = None) -> None:
        """``complete`` for async code: the event loop goes on while the checkpoint commits."""
        await self._afinish(result, also, ItemStatus.COMPLETED)

    async def adegrade(self, result: Any = None, *, also: Callable[[Any], None] | None = None) -> None:
        """``degrade`` for async code."""
        await self._afinish(result, also, ItemStatus.DEGRADED)

    def _complete_later(self, result: Any) -> Future[Any]:
        """``complete`` without waiting for the commit, for a map completing an item with what its function
        returned: the checkpoint (with the item's calls, taken now) is queued to the group commit, whose future
        tells whether it committed."""
        self._refuse_twice()
        assert self.committer is not None, "only a map's items complete later"
        queued = self.committer.submit(self.node._entry(self.key, result, None, ItemStatus.COMPLETED))
        self.finished = True
        return queued

    def _finish(self, result: Any, also: Callable[[Any], None] | None, status: str) -> None:
        self._refuse_twice()
        if self.committer is None:
            self.node._checkpoint(self.key, result, also=also, status=status)
        else:
            self.committer.submit(self.node._entry(self.key, result, also, status)).result()
        self.finished = True

    async def _afinish(self, result: Any, also: Callable[[Any], None] | None, status: str) -> None:
        self._refuse_twice()
        if self.committer is None:
            await asyncio.to_thread(contextvars.copy_context().run, self.node._checkpoint, self.key, result,
                                    also=also, status=status)
        else:
            await asyncio.wrap_future(self.committer.submit(self.node._entry(self.key, result, also, status)))
        self.finished = True

    def _refuse_twice(self) -> None:
        if self.finished:
            raise Failure(description=f"item {self.key!r} of node {self.node.node_name} completed twice",
                          allow_retries=False)


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
        self._recorder: CallRecorder | None = None  # the process's, once this node records a call itself
        self._calls: dict[str | None, list[ProviderCall]] = {}
        self._calls_lock = threading.Lock()
        self._progress: ProgressReporter | None = None
        self.calls_recorded = 0
        # Set in a step process once its run worker is gone: no new provider call or item may start.
        self.run_worker_gone = run_worker_gone
        self._journal: CallJournal | None = None
        self._journal_lock = threading.Lock()
        # A retry of this node (after its own outage pause, say) goes on with the pipeline's outage clock
        # (``waiting_since``) until this try finishes an item: see end_outage_if_progressed.
        self.outage_clock_kept = False
        self._outage_lock = threading.Lock()
        self._maps_not_awaited = 0  # ctx.amap(...) calls whose coroutine has not started: never awaited, so far

    @property
    def journal(self) -> CallJournal:
        """Provider answers kept before the body sees them, replayed to a resume (see journaled_call). Made at
        its first use: a node that journals no call never builds one, nor resets it at each item."""
        journal = self._journal
        if journal is None:
            with self._journal_lock:
                if self._journal is None:
                    self._journal = CallJournal(self, self._store)
                journal = self._journal
        return journal

    def made_progress(self) -> bool:
        """Whether this try kept progress of its own: an item finished. A provider answer is none: a retry may ask
        it again (a call the journal does not key, or keys anew each try) or get it back from the journal, so a try
        that only gets answers before failing again must not make its outage look over."""
        return self.items_done > 0

    def outage_goes_on(self) -> bool:
        """In a retried try that kept no progress yet, an answer ending a pause does not end the outage clock."""
        return self.outage_clock_kept and not self.made_progress()

    def end_outage_if_progressed(self) -> None:
        """A retried node's outage is over once its try finished an item: the pipeline's outage clock ends, so the
        healthy stretch since is no outage time, and a later failure starts an outage of its own (before: a 503
        after a healthy stretch as long as the budget gave up at once). Called where the clock is read, when a
        call or the node fails, never on an item's checkpoint; it ends nothing while a pause is shown (a call or
        node still sleeps through the outage). A try that finishes no item leaves it running, whatever answers it
        got, so an overload that persists still gives up at the budget: each further try needs a new item."""
        if not self.outage_clock_kept or not self.made_progress():
            return
        with self._outage_lock:
            if self.outage_clock_kept and self._store.providers.end_outage_clock(self.ownership,
                                                                                 node=self.node_name):
                self.outage_clock_kept = False

    @property
    def log(self) -> Any:  # the op's DagsterLogManager
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
        watchdog, gone = self.watchdog, self.run_worker_gone  # check() inlined: this runs before every item
        if watchdog is not None:
            watchdog.check()
        if gone is not None and gone.is_set():
            raise StopRequested("the run worker is gone: this step process starts no new provider call")

    def run_worker_died(self) -> bool:
        """This step process's run worker died and no other run has taken the pipeline over (yet): the requests
        already sent are still answered and kept (the epoch fence holds), nothing new is sent."""
        gone, watchdog = self.run_worker_gone, self.watchdog
        return gone is not None and gone.is_set() and (watchdog is None or watchdog.lost is None)

    def in_flight_grace(self) -> float:
        """How long a map whose run worker died waits for its requests in flight: one heartbeat timeout, after
        which another run may take the pipeline over and refuse their answers anyway."""
        return self.settings.timeout

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
                key = call.item_key if call.item_key is not None else self.current_item
            own = self.ownership
            bound = replace(call, pipeline_id=own.pipeline_id, node_name=self.node_name, item_key=key,
                            run_id=own.owner, epoch=own.epoch)
            with self._calls_lock:
                self._calls.setdefault(key, []).append(bound)
                self.calls_recorded += 1
            if self._recorder is None:
                self._recorder = recorder_for(self._store)
            self._recorder.record(bound)
        except Exception as exc:  # noqa: BLE001 - recording a call must never fail the work
            log.warning("provider call not recorded: %s", redact(exc))
            return False
        observe(bound)  # the one place every call of a node passes (record_provider_call arrives here too)
        return True

    @property
    def current_item(self) -> str | None:
        """The key of the item this thread or task works on (None: outside any item of this node)."""
        working = current_item.get()
        return working[1] if working is not None and working[0] is self else None

    def _enter_item(self, key: str | None) -> None:
        current_item.set(None if key is None else (self, key))

    def keep_call(self, call: ProviderCall) -> None:
        """A call already in the ledger whose answer this node uses: its item's checkpoint (or the node's
        completion) marks it as kept."""
        with self._calls_lock:
            self._calls.setdefault(call.item_key, []).append(call)

    def _take_calls(self, key: str | None) -> tuple[ProviderCall, ...]:
        # The usual item made no call and no call waits for any item: no lock taken. A call made for this item
        # was recorded before its completion began, by the code that completes it.
        if not self._calls:
            return ()
        with self._calls_lock:
            calls = self._calls.pop(key, ())
        # an item retried after its answer arrived holds that call twice (kept when answered, kept again when
        # the retry got it back from the journal): one row, its latest form
        return tuple({call.id: call for call in calls}.values())

    def calls_written(self, calls: Sequence[ProviderCall]) -> None:
        """``calls`` reached the database with a checkpoint or the node's completion: the recorder lets them go."""
        if calls and self._recorder is not None:
            self._recorder.written(calls)

    def flush_ledger(self) -> bool:
        """Write the recorded calls no checkpoint took (best effort; they stay buffered if the database is away).
        The recorder is the process's: it writes the other nodes' too. A node that recorded none has nothing to
        write (the recorder's own thread writes what is left)."""
        return True if self._recorder is None else self._recorder.flush()

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
        counter = _COUNTERS.get(outcome)
        if counter is None:
            raise ValueError(f"unknown item outcome {outcome!r}; one of {', '.join(ITEM_OUTCOMES)}")
        with self._count_lock:
            setattr(self, counter, getattr(self, counter) + number)

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
        keys = list(dict.fromkeys(map(str, keys)))  # a key given twice is one item (and counts once)
        todo, _ = self._unfinished("ctx.items", keys, unique=False)
        self._batch, self._flush_seconds = batch, flush_seconds
        # A full batch is flushed by the completion that fills it; only a batch's age can come due between items.
        timed = flush_seconds is not None
        try:
            for key in todo:
                if timed:
                    self._flush_if_due()
                self.check_calls()
                current_item.set((self, key))  # _enter_item(key), without a call per item
                yield Item(self, key)
            self._enter_item(None)
            self.flush()
            self._progress_end()
        finally:
            self._enter_item(None)
            self._batch, self._flush_seconds = 1, None
            self._progress = None

    def items_finished(self) -> int:
        """Items of the node finished so far: kept from earlier runs, done or degraded by this one."""
        return self.items_resumed + self.items_done + self.items_degraded

    async def aitems(self, keys: Iterable[str]) -> AsyncIterator[Item]:
        """``async for item in ctx.aitems(keys)``: ``items()`` for an ``async def`` body, one item at a time.

        Checkpoint with ``await item.acomplete(result)``: the commit runs off the event loop (with any
        other completions of this node under way, in one fenced transaction). For items in parallel use
        ``await ctx.amap(fn, keys, concurrency=N)``.
        """
        todo, _ = await asyncio.to_thread(self._unfinished, "ctx.aitems", keys, unique=False)
        committer = self._group_committer()
        try:
            for key in todo:
                self.check_calls()
                self._enter_item(key)
                yield Item(self, key, committer)
            self._enter_item(None)
        finally:
            self._enter_item(None)
            await asyncio.to_thread(committer.close)
            await asyncio.to_thread(self._progress_end)

    def map(self, fn: Callable[[Item], Any], keys: Iterable[Any], *, concurrency: int = 8,
            retries: int | None = None) -> MapResult:
        """Work the unfinished items of ``keys`` with ``fn(item)``, up to ``concurrency`` at once in threads.

        ``fn`` returns the item's result (a JSON value), checkpointed as soon as it returns, with the
        completions of other items finishing at the same moment (one fenced transaction); or it calls
        ``item.complete(...)``/``item.degrade(...)`` itself. Each item's provider calls belong to it. A
        failing item is retried on its own (transient errors, ``retries`` times, default the resource's
        ``max_retries``) and never stops its siblings; failed items are named in one ``ItemsFailed``
        at the end. Returns a :class:`MapResult`; results are read back with ``ctx.completed_items()``.
        """
        try:
            return map_in_threads(self, fn, keys, concurrency=concurrency, retries=retries)
        finally:
            self._progress_end()

    def amap(self, fn: Callable[[Item], Awaitable[Any]], keys: Iterable[Any], *, concurrency: int = 8,
             retries: int | None = None) -> Coroutine[Any, Any, MapResult]:
        """``map`` for ``async def fn(item)``: up to ``concurrency`` items at once as asyncio tasks
        (``await ctx.amap(...)``; a call never awaited fails the node when its body returns)."""
        self._maps_not_awaited += 1
        return self._amap(fn, keys, concurrency=concurrency, retries=retries)

    async def _amap(self, fn: Callable[[Item], Awaitable[Any]], keys: Iterable[Any], *, concurrency: int,
                    retries: int | None) -> MapResult:
        self._maps_not_awaited -= 1  # on the event loop's one thread, as the call that counted it
        try:
            return await map_in_tasks(self, fn, keys, concurrency=concurrency, retries=retries)
        finally:
            await asyncio.to_thread(self._progress_end)

    def check_maps_awaited(self) -> None:
        """Fail the node (for good: it is the body's code) when it called ``ctx.amap`` without ``await``: none
        of those items was worked, and the node would otherwise complete as if they were."""
        if self._maps_not_awaited:
            raise Failure(description=f"node {self.node_name} called ctx.amap(...) without `await`, so none of its "
                                      "items was worked: write `await ctx.amap(...)`", allow_retries=False)

    def _unfinished(self, name: str, keys: Iterable[Any], *, unique: bool = True) -> tuple[Iterator[str], int]:
        """Record the node's item total; (the keys not finished before, lazily; how many were)."""
        listed = unique_keys(name, keys) if unique else list(map(str, keys))
        _refuse_unstorable_keys(name, listed, self._store.dialect)
        statuses = self._store.pipelines.start_items(self.ownership, self.node_name, len(listed))
        done = {k for k, status in statuses.items() if status != ItemStatus.DEGRADED}
        resumed = sum(1 for k in listed if k in done) if done else 0
        self.count_items(ItemOutcome.RESUMED, resumed)
        if resumed:
            self.log.info(f"resuming node {self.node_name}: {resumed}/{len(listed)} items already done")
        self._progress = ProgressReporter(self.context, self.node_name, len(listed))
        self._progress.update(self.items_finished())
        return (iter(listed) if not done else (k for k in listed if k not in done)), resumed

    def _progress_end(self) -> None:
        """The items ran out (or the loop ended): the run's page shows the count they reached."""
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.update(self.items_finished(), final=True)

    def _item_for(self, key: str, committer: GroupCommitter[ItemCheckpoint]) -> Item:
        return Item(self, key, committer)

    def _group_committer(self, max_wait: float = 0.0) -> GroupCommitter[ItemCheckpoint]:
        """A writer that commits the completions of this node's items in batches (see group_commit)."""
        own, node, stall = self.ownership, self.node_name, self.settings.stall_timeout

        def commit(entries: Any) -> None:
            self.check()
            self._store.pipelines.checkpoint_items(own, node, entries, stall_timeout=stall)

        return GroupCommitter(commit, committed=self._count, max_wait=max_wait, name=f"rx-commit-{node}")

    def _journal_committer(self, max_wait: float = 0.0) -> GroupCommitter[JournalWrite]:
        """A writer that commits the call journal's begins and answers of this node's items in flight together
        in batches, each batch one transaction fenced by this worker's epoch (see group_commit)."""
        own, providers = self.ownership, self._store.providers

        def commit(writes: Sequence[JournalWrite]) -> list[JournalHit | None | Exception]:
            return providers.journal_writes(own, writes)

        return GroupCommitter(commit, max_wait=max_wait, name=f"rx-journal-{self.node_name}")

    def _entry(self, key: str, result: Any, also: Callable[[Any], None] | None, status: str) -> ItemCheckpoint:
        """An item's checkpoint as the store writes it, with the provider calls made for it."""
        self.check()
        return ItemCheckpoint(key, _json_text(result), status, also, self._take_calls(key))

    def checkpoint(self, key: str, result: Any = None, *, also: Callable[[Any], None] | None = None,
                   status: str = ItemStatus.COMPLETED) -> None:
        """Checkpoint the item ``key`` of this node with ``result`` (what ``item.complete`` does for an item of
        ``ctx.items()``). A key no checkpoint could store (a NUL on PostgreSQL, a lone surrogate) is refused
        with a :class:`ConfigurationError` naming it, instead of the driver's error."""
        key = str(key)
        _refuse_unstorable_keys("ctx.checkpoint", [key], self._store.dialect, outcome="nothing was written")
        self._checkpoint(key, result, also=also, status=status)

    def _checkpoint(self, key: str, result: Any = None, *, also: Callable[[Any], None] | None = None,
                    status: str = ItemStatus.COMPLETED) -> None:
        """:meth:`checkpoint` of a key ``ctx.items()`` checked already."""
        batch = self._batch
        if batch == 1:  # a buffered completion needs no check of its own: its flush checks before it writes
            self.check()
        # Encoded once, here: the store writes this text as it is (a batch of 1,000 items spends most of
        # its client time on per-item work, so none of it is done twice).
        entry = ItemCheckpoint(key, _json_text(result), status, also, self._take_calls(key) if self._calls else ())
        if batch > 1:
            pending = self._pending
            if key in pending:
                raise Failure(description=f"item {key!r} of node {self.node_name} completed twice",
                              allow_retries=False)
            if not pending:
                self._pending_since = time.monotonic()
            pending[key] = entry
            if len(pending) >= batch or self._flush_seconds is not None:  # else _flush_if_due has nothing due
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
        pending = self._pending
        if pending and (len(pending) >= self._batch or (
                self._flush_seconds is not None and time.monotonic() - self._pending_since >= self._flush_seconds)):
            self.flush()

    def _count(self, entries: Sequence[ItemCheckpoint]) -> None:
        journal = self._journal
        if journal is not None:  # a finished item's call numbering is done with (100,000 items: no growth)
            for entry in entries:
                journal.restart_item(entry.key)
        if self._recorder is not None:
            self.calls_written([call for entry in entries for call in entry.calls])
        if len(entries) == 1:  # a per-item loop's checkpoint
            degraded = 1 if entries[0].status == ItemStatus.DEGRADED else 0
        else:
            degraded = list(map(_STATUS, entries)).count(ItemStatus.DEGRADED)  # at C speed: once per batch
        if degraded:  # a count of 0 takes no lock (a per-item loop counts once per item)
            self.count_items(ItemOutcome.DEGRADED, degraded)
        if len(entries) > degraded:
            self.count_items(ItemOutcome.DONE, len(entries) - degraded)
        if self._progress is not None:
            self._progress.update(self.items_finished())


def store_of(ctx: NodeContext) -> OpStore:
    """The store a node writes through, for the library's own helpers that take a node's context (a provider
    guard, a provider job): user code is not given it (see :class:`NodeContext`)."""
    return ctx._store
