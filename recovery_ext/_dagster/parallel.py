"""Items worked in parallel: ``ctx.map`` (threads) and ``await ctx.amap`` (asyncio tasks).

Both keep at most ``concurrency`` items in flight and create nothing per key up front: the keys are
read as the window frees (100,000 keys cost the keys, not 100,000 futures). Each item runs in a
context of its own (:data:`recovery_ext._dagster.context.current_item` is set there), so its provider
calls, journal entries, ledger rows and budget reservations belong to it, whichever thread or task
runs it. Each item is retried on its own under the resource's policy (transient errors only, through
the shared classifier) and checkpoints through one :class:`GroupCommitter` as it finishes; the call
journal's two fenced writes per request (the begin before it leaves, the answer before the item sees it)
go through a second one, so the items in flight share a few transactions instead of each writing alone.
``ctx.map`` runs ``concurrency`` threads that each take the next key themselves; a thread whose item's
function returned queues that item's checkpoint and starts its next item while it commits (it waits for
it before queueing another); the item counts as done, or failed, once its checkpoint committed or was refused.

A failed item never stops its siblings. The map stops starting items when this worker is superseded
or its run worker died (nothing new is sent: threads stop before their next call; tasks in flight are
cancelled when superseded, and waited for when the run worker died, so the answers already paid for are
kept), and when ``same_error_limit`` items in a row failed the same way (a bad key or an outage fails every
item alike: the node's own error path then fails or pauses the pipeline). Items that failed are named in one
:class:`ItemsFailed` at the end; a resume redoes only the unfinished ones.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import tenacity

from recovery_ext._classify.classifier import ClassifiedError, classify
from recovery_ext._classify.retry import RetryPolicy, retry_if_retryable, without_escalation
from recovery_ext._dagster.group_commit import GroupCommitter
from recovery_ext._providers.steps import checked_async_sleep, checked_sleep
from recovery_ext._errors import ConfigurationError, OwnershipLost, StopRequested, StoreUnavailable, in_chain
from recovery_ext._settings import check_count
from recovery_ext._store.statuses import ItemOutcome



class Item(Protocol):
    """What a map hands each item's function (``recovery_ext.Item``)."""

    key: str
    finished: bool

    def complete(self, result: Any = None) -> None: ...

    async def acomplete(self, result: Any = None) -> None: ...

    def _complete_later(self, result: Any) -> Future[Any]: ...


class NodeContext(Protocol):
    """What a map needs of its node (``recovery_ext.NodeContext``; this module cannot import it: it imports us)."""

    node_name: str
    resource: Any

    @property
    def journal(self) -> Any: ...

    @property
    def log(self) -> Any: ...

    def check_calls(self) -> None: ...

    def run_worker_died(self) -> bool: ...

    def in_flight_grace(self) -> float: ...

    def count_items(self, outcome: str, number: int = 1) -> None: ...

    def _enter_item(self, key: str | None) -> None: ...

    def _unfinished(self, name: str, keys: Iterable[Any], *, unique: bool = True) -> tuple[Iterator[str], int]: ...

    def _item_for(self, key: str, committer: GroupCommitter[Any]) -> Item: ...

    def _group_committer(self, max_wait: float = 0.0) -> GroupCommitter[Any]: ...

    def _journal_committer(self, max_wait: float = 0.0) -> GroupCommitter[Any]: ...

log = logging.getLogger("recovery_ext._dagster.parallel")

MAX_CONCURRENCY = 1024
NAMED_FAILURES = 1000  # failed keys kept by name; past that only counted
LOGGED_FAILURES = 20  # item failures logged one by one; past that only summed up at the end

# From this concurrency on, a map's group commits wait up to BATCH_WAIT for more entries before committing.
# Fewer, larger transactions cost less CPU, which a busy process runs out of first (one GIL): at 64 items in
# flight on the 2-core test machine (1,000 calls of 200 ms, SQLite) one pair of runs gave 9.4 ms of CPU per
# item without the wait and 4.4 ms with a 5 ms one (noisy: see docs/how-to/parallel-items.md). Once asyncio's
# journaled calls started apart (send_starts), 1 ms did better than 5 at 64, on the idle machine, runs of the
# two alternating: 276-288 recoverable items/s against 265-275 with threads on both databases, 260-267 against
# 241 with asyncio on SQLite (bench/concurrency_bench.py). At 8 in flight a window rarely catches another entry
# and would only add its wait to each item (3 commits per item).
BATCH_AT = 32
BATCH_WAIT = 0.001

# Errors that end the whole map at once: this worker may not go on (or was told to stop).
STOPPING = (OwnershipLost, StopRequested, StoreUnavailable)


class ItemsFailed(ClassifiedError):
    """Some items of a ``ctx.map``/``ctx.amap`` failed after their retries; the others are checkpointed.

    Permanent if any item failed permanently, else transient (its category is the commonest of the
    items'), so the node fails, retries or pauses as for one error; a resume redoes only these items.
    """

    def __init__(self, node: str, failed: dict[str, ClassifiedError], total_failed: int, stopped_early: bool,
                 permanent_unnamed: ClassifiedError | None = None) -> None:
        self.failed = failed
        self.total_failed = total_failed
        # ``permanent_unnamed``: a permanent failure of an item past the ones named, which decides as well
        permanent = [e for e in failed.values() if not e.retryable] or \
            ([permanent_unnamed] if permanent_unnamed is not None else [])
        pool = permanent or list(failed.values())
        category = Counter(e.category for e in pool).most_common(1)[0][0] if pool else "unknown"
        shown = "; ".join(f"{key}: {err}" for key, err in list(failed.items())[:5])
        more = f" (and {total_failed - 5} more)" if total_failed > 5 else ""
        why = " - stopped starting items after repeated failures" if stopped_early else ""
        decided = permanent[0] if permanent and permanent[0] is permanent_unnamed else None
        unnamed = f"; and one failed for good past those named: {decided}" if decided is not None else ""
        super().__init__(category=category, retryable=not permanent,
                         message=f"{total_failed} item(s) of node {node} failed{why}: {shown}{more}{unnamed}")


@dataclass
class MapResult:
    """What one ``ctx.map``/``ctx.amap`` did: items finished by it, skipped as done before, and failed."""

    done: int = 0
    resumed: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # key -> reason (the first NAMED_FAILURES)


class _Tally:
    """Outcomes as items end (called under the map's lock, or from the scheduling task only)."""

    def __init__(self, node: NodeContext, limit: int) -> None:
        self.node = node
        self.limit = limit
        self.result = MapResult()
        self.failed: dict[str, ClassifiedError] = {}
        self.failed_count = 0
        self.permanent_unnamed: ClassifiedError | None = None  # the first permanent failure past the named ones
        self.streak: tuple[str | None, int] = (None, 0)
        self.fatal: BaseException | None = None
        self.stopped_early = False

    @property
    def stop(self) -> bool:
        return self.fatal is not None or self.stopped_early

    def ended(self, key: str, exc: BaseException | None) -> None:
        if exc is None:
            self.result.done += 1
            self.streak = (None, 0)
            return
        stop = in_chain(exc, STOPPING)
        if isinstance(stop, StopRequested) and self.stopped_early and self._node_goes_on():
            return  # the map's own stop ended this item's retry pause: an item left undone, not a fatal stop
        if not isinstance(exc, Exception) or stop is not None:
            if self.fatal is None:
                self.fatal = stop or exc
            return
        exc = without_escalation(exc)  # the node escalates a transient streak itself: it pauses
        err = exc if isinstance(exc, ClassifiedError) else _classified(exc)
        self.failed_count += 1
        self.node.count_items(ItemOutcome.FAILED)
        if len(self.failed) < NAMED_FAILURES:
            self.failed[key] = err
            self.result.failed[key] = str(err)
        elif not err.retryable and self.permanent_unnamed is None:
            self.permanent_unnamed = err
        if self.failed_count <= LOGGED_FAILURES:
            self.node.log.warning(f"{self.node.node_name}: item {key!r} failed "
                                  f"({'transient' if err.retryable else 'permanent'}): {err}")
        kind = f"{err.category}/{err.retryable}"
        count = self.streak[1] + 1 if self.streak[0] == kind else 1
        self.streak = (kind, count)
        if count >= self.limit:
            self.stopped_early = True

    def _node_goes_on(self) -> bool:
        """No stop of the node's own (a take-over, the run worker's death) is behind a stop."""
        try:
            self.node.check_calls()
        except STOPPING:
            return False
        return True

    def outcome(self) -> MapResult:
        if self.fatal is not None:
            raise self.fatal
        if self.failed_count:
            raise ItemsFailed(self.node.node_name, self.failed, self.failed_count, self.stopped_early,
                              self.permanent_unnamed)
        return self.result


def _classified(exc: Exception) -> ClassifiedError:
    found = classify(exc)
    # its words as a node's error says them (redacted; an SDK's wrapper keeps the classified reason it wraps)
    return ClassifiedError(exc, category=found.category, retryable=found.retryable)


def check_concurrency(name: str, concurrency: object) -> int:
    return check_count(f"{name}(concurrency=...)", concurrency, minimum=1, maximum=MAX_CONCURRENCY)


def unique_keys(name: str, keys: Iterable[Any]) -> list[str]:
    """The keys as strings, refused whole (before any work) when one is given twice."""
    if isinstance(keys, (str, bytes)):
        raise ConfigurationError(f"{name}: keys must be an iterable of keys, not one {type(keys).__name__}")
    listed = [str(k) for k in keys]
    seen: set[str] = set()
    for key in listed:
        if key in seen:
            raise ConfigurationError(f"{name}: key {key!r} is given twice; each item needs a key of its own")
        seen.add(key)
    return listed


def _is_async_callable(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = None if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__dict__.get("__call__")
    return call is not None and inspect.iscoroutinefunction(call)


def _policy(node: NodeContext, retries: int | None, stop: threading.Event | None) -> RetryPolicy:
    # An item's same-error streak ends its retries without making its error permanent: a transient one then
    # fails the item as transient, and the node retries or pauses as for any transient error (only the outage
    # budget gives up). A provider overloaded for a while, raised to the SDK after the guarded call (a stream
    # ending on its error event), must not fail the pipeline for good.
    overrides: dict[str, Any] = {"shutdown": stop, "escalate": False}
    if stop is not None:  # a retry pause ends when the map stops, or once no new call may leave (superseded, or
        # the run worker died): the retry would be refused, and an orphaned step must not outlive a long Retry-After
        overrides["sleep"] = checked_sleep(stop, node.check_calls)
    if retries is not None:
        overrides["max_attempts"] = retries + 1
    policy: RetryPolicy = node.resource.retry_policy(**overrides)
    return policy


# -- threads ------------------------------------------------------------------------------------------------

def _run_item(node: NodeContext, item: Item, fn: Callable[[Any], Any], attempts: tenacity.Retrying
              ) -> Future[Any] | None:
    """One item in a map's thread, in a context of its own: its calls, its retries (``attempts``: the policy's
    retrying, one per thread, begun again for each item), then its checkpoint queued (its future, when the map
    completes the item with what ``fn`` returned; None: ``fn`` completed it)."""
    node._enter_item(item.key)
    node.check_calls()
    result: Any = None
    for attempt in attempts:
        with attempt:
            node.check_calls()
            node.journal.restart_item(item.key)  # a retry replays the answers its first attempt paid for
            result = fn(item)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise ConfigurationError(f"ctx.map: the item function returned an awaitable for item {item.key!r}; "
                                 "an async function is mapped with `await ctx.amap(...)`")
    return None if item.finished else item._complete_later(result)


def map_in_threads(node: NodeContext, fn: Callable[[Any], Any], keys: Iterable[Any], *, concurrency: int,
                   retries: int | None) -> MapResult:
    if _is_async_callable(fn):
        raise ConfigurationError("ctx.map: the item function is async; map it with `await ctx.amap(...)`")
    if not callable(fn):
        raise ConfigurationError(f"ctx.map: the item function must be callable, got {type(fn).__name__}")
    concurrency = check_concurrency("ctx.map", concurrency)
    if retries is not None:
        check_count("ctx.map(retries=...)", retries, minimum=0, maximum=100)
    todo, resumed = node._unfinished("ctx.map", keys)
    stop = threading.Event()
    policy = _policy(node, retries, stop)
    tally = _Tally(node, node.resource.same_error_limit)
    tally.result.resumed = resumed
    wait_for = BATCH_WAIT if concurrency >= BATCH_AT else 0.0
    committer = node._group_committer(wait_for)
    journal_writer = node._journal_committer(wait_for)
    node.journal.attach(journal_writer)
    # `concurrency` threads, each taking the next key itself once its item ended (no future, no hand-off to a
    # scheduling thread per item: at 64 in flight those wake-ups cost more CPU than the items' own work). The
    # tally, the keys and the checks before a new item are shared under one lock, in the order a scheduling
    # loop would take them: no item starts once the map must stop.
    lock = threading.Lock()
    pending = iter(todo)
    base = contextvars.copy_context()  # each item runs in a copy of the op's context, as a pool's would
    raised: list[BaseException] = []  # an error of the keys themselves (or an interrupt): the map raises it

    def next_item() -> Item | None:
        with lock:
            if tally.stop or raised:
                return None
            try:
                key = next(pending, None)
                if key is None or _stop_now(node, tally):
                    return None
                return node._item_for(key, committer)
            except BaseException as exc:  # noqa: BLE001 - raised by the map, in its caller's thread
                raised.append(exc)
                stop.set()
                return None

    def ended(key: str, error: BaseException | None) -> None:
        with lock:
            tally.ended(key, error)
            if tally.stop:
                stop.set()

    def checkpointed(key: str, done: Future[Any]) -> None:
        ended(key, StopRequested("cancelled") if done.cancelled() else done.exception())

    def work(item: Item | None) -> None:
        # An item whose function returned is done once its checkpoint commits: the thread does not wait for that
        # commit to start its next item (its answers are kept already; the checkpoint is fenced like any write,
        # and tallied when it commits). It waits for it once its next item has queued its own: a thread has at
        # most two checkpoints queued, the one committing and the next, so instant items cannot queue up
        # thousands of them, and the next can join the group commit after the one under way (waiting for that
        # one before queueing the next cost a tenth of the items' rate at 32 threads with 10 ms calls).
        queued: Future[Any] | None = None
        attempts = policy.build()  # a tenacity Retrying costs more to build than to begin again per item
        while item is not None:
            error: BaseException | None = None
            checkpoint: Future[Any] | None = None
            try:
                checkpoint = base.copy().run(_run_item, node, item, fn, attempts)
            except BaseException as exc:  # noqa: BLE001 - the item's outcome, tallied like any other
                error = exc
            if queued is not None:
                futures_wait([queued])
            if checkpoint is None:
                ended(item.key, error)
            else:
                checkpoint.add_done_callback(functools.partial(checkpointed, item.key))
            queued = checkpoint
            item = next_item()
        if queued is not None:
            futures_wait([queued])

    workers: list[threading.Thread] = []
    try:
        while len(workers) < concurrency:  # a thread per item in flight, started only while keys remain
            first = next_item()
            if first is None:
                break
            worker = threading.Thread(target=work, args=(first,), name=f"rx-{node.node_name}_{len(workers)}",
                                      daemon=True)
            workers.append(worker)
            worker.start()
        for worker in workers:
            worker.join()
    except BaseException as exc:
        with lock:
            raised.append(exc)
        stop.set()
        raise
    finally:
        for worker in workers:
            worker.join()
        node.journal.detach(journal_writer)
        journal_writer.close()
        committer.close()
    if raised:
        raise raised[0]
    return tally.outcome()


def _stop_now(node: NodeContext, tally: _Tally) -> bool:
    """Checked before each new item: a superseded worker or a dead run worker starts nothing more."""
    try:
        node.check_calls()
    except STOPPING as exc:
        tally.fatal = tally.fatal or exc
        return True
    return False


def _answers_still_kept(node: NodeContext, fatal: BaseException) -> bool:
    """The map stopped because this step's run worker died, and this worker still owns the pipeline: the
    requests already sent are waited for, not cancelled. Their answers are kept and their items checkpointed
    (the epoch fence holds until a take-over, and refuses them after one), so the resume does not pay for them
    again; nothing new is sent (each task checks before each attempt, and a wait at a cap or a budget stops)."""
    return isinstance(fatal, StopRequested) and node.run_worker_died()


async def _cancel_after_grace(node: NodeContext, running: dict[asyncio.Task[None], str]) -> None:
    """While a map whose run worker died waits for its requests in flight: cancel what is left once a take-over
    superseded this worker (its answers would be refused) or one heartbeat timeout passed (a take-over may come
    any time after it, and a request with no timeout must not keep the orphaned step process alive for good)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + node.in_flight_grace()
    while running and node.run_worker_died() and loop.time() < until:
        await asyncio.sleep(0.1)
    for task in list(running):
        task.cancel()


# -- asyncio tasks ------------------------------------------------------------------------------------------

async def _run_item_async(node: NodeContext, item: Item, fn: Callable[[Any], Awaitable[Any]],
                          policy: RetryPolicy) -> None:
    node._enter_item(item.key)  # a task runs in its own copy of the context
    node.check_calls()
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts) | policy.same_error, wait=policy.retry_after,
        retry=retry_if_retryable(), sleep=checked_async_sleep(node.check_calls),
        retry_error_callback=policy._give_up,
    )
    result: Any = None
    async for attempt in retrying:
        with attempt:
            node.check_calls()
            node.journal.restart_item(item.key)
            result = await fn(item)
    if not item.finished:
        await item.acomplete(result)


async def map_in_tasks(node: NodeContext, fn: Callable[[Any], Awaitable[Any]], keys: Iterable[Any], *,
                       concurrency: int, retries: int | None) -> MapResult:
    if not _is_async_callable(fn):
        raise ConfigurationError("ctx.amap: the item function must be an `async def` function (a coroutine "
                                 "function); map a plain function with ctx.map(...), which runs it in threads")
    concurrency = check_concurrency("ctx.amap", concurrency)
    if retries is not None:
        check_count("ctx.amap(retries=...)", retries, minimum=0, maximum=100)
    todo, resumed = await asyncio.to_thread(node._unfinished, "ctx.amap", keys)
    policy = _policy(node, retries, None)
    tally = _Tally(node, node.resource.same_error_limit)
    tally.result.resumed = resumed
    wait_for = BATCH_WAIT if concurrency >= BATCH_AT else 0.0
    committer = node._group_committer(wait_for)
    journal_writer = node._journal_committer(wait_for)
    node.journal.attach(journal_writer)
    running: dict[asyncio.Task[None], str] = {}
    ended: asyncio.Queue[asyncio.Task[None]] = asyncio.Queue()  # each task as it ends (as in map_in_threads)

    async def settle_next() -> None:
        task = await ended.get()
        while True:
            key = running.pop(task)
            tally.ended(key, StopRequested("cancelled") if task.cancelled() else task.exception())
            try:
                task = ended.get_nowait()
            except asyncio.QueueEmpty:
                break

    grace: asyncio.Task[None] | None = None
    try:
        for key in todo:
            while len(running) >= concurrency and not tally.stop:
                await settle_next()
            if tally.stop or _stop_now(node, tally):
                break
            item = node._item_for(key, committer)
            task = asyncio.create_task(_run_item_async(node, item, fn, policy))
            running[task] = key
            task.add_done_callback(ended.put_nowait)
        if tally.fatal is not None and running:
            if _answers_still_kept(node, tally.fatal):
                grace = asyncio.create_task(_cancel_after_grace(node, running))
            else:
                for task in running:
                    task.cancel()  # nothing new leaves: a superseded op's answers would be refused anyway
        while running:
            await settle_next()
    except BaseException:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
        raise
    finally:
        if grace is not None:  # also when the map itself is cancelled or fails while it waits
            grace.cancel()
        node.journal.detach(journal_writer)
        await asyncio.to_thread(journal_writer.close)
        await asyncio.to_thread(committer.close)
    return tally.outcome()
