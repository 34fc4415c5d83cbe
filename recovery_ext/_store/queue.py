"""The work queue: enqueue, claim (SKIP LOCKED), heartbeat, complete, fail, reset.

``attempts`` counts started attempts: a claim increments it ("ocr_attempts
incremented" when processing starts), so an item whose worker died has used one.

Two fences guard every write a worker makes, both checked in the write's own transaction:

* the pipeline fence: a claim made for a pipeline records its id and epoch on the item
  (``holder_pipeline_id``/``holder_epoch``); heartbeats, completions and failures then
  lock that pipeline row through :meth:`~recovery_ext._store.database.Fence.check` and are refused once a reclaim
  bumped its epoch, so a superseded run can neither claim nor finish documents;
* the item fence ``(worker, attempts)``: once an item was claimed again, the first
  worker's write raises :class:`~recovery_ext._errors.ItemTakenOver`. An item that was
  reset but that nobody took over is still accepted from its last worker, so a slow
  worker's result is never thrown away for nothing.

One rule decides staleness (:meth:`Queue._stale_condition`), used by claims, the
stuck-item sensor, ``reset-stuck`` and ``status``: a ``processing`` item is stale when its
heartbeat deadline passed, when the pipeline holding it was superseded or finished, or,
for rows with no heartbeat deadline at all (legacy rows written before heartbeats existed), when it started
longer ago than the legacy stale threshold. A failed item waits ``available_at`` (jittered
exponential backoff) before it can be claimed again.

Lock order is always pipeline row, then item rows, and every item row a transaction
writes is locked ``FOR UPDATE`` (the strongest lock it needs) before it is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (Connection, Float, Text, and_, case, exists, func, literal, literal_column, or_, select,
                        type_coerce, update)
from sqlalchemy import Select
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._store.database import Component, Database, Fence, chunks, is_retry, retried
from recovery_ext._errors import ConfigurationError, IllegalTransition, ItemTakenOver, NotFound
from recovery_ext._store.models import Backoff, Ownership, QueueItem, ResetItem, StaleItem
from recovery_ext._classify.redaction import redact
from recovery_ext._classify.retry import wait_jittered_exponential
from recovery_ext._conventions import CorruptJson
from recovery_ext._store.schema import pipelines, queue_items
from recovery_ext._store.statuses import UNFINISHED_QUEUE_STATUSES, QueueStatus

q = queue_items.c
# Inline constants, not bound parameters, so PostgreSQL matches the partial indexes.
PROCESSING: ColumnElement[str] = literal_column(f"'{QueueStatus.PROCESSING}'")
READY: ColumnElement[str] = literal_column(f"'{QueueStatus.READY}'")
RESET_NOTE = "Reset by stale monitor"
#: The legacy stale threshold (10 min); it applies only to rows without a heartbeat deadline.
LEGACY_STALE_SECONDS = 600.0


def default_retry_backoff() -> wait_jittered_exponential:
    """30 s, doubling, at most 30 min, +-10 % jitter between failed attempts of one item."""
    return wait_jittered_exponential(30.0, max_delay=1800.0, jitter=0.1)


class Queue(Component):
    """``store.queue``, the work queue (:class:`~recovery_ext._store.interfaces.QueueStore`). Writes for an owner
    go through ``fence`` (the pipeline row's lock and epoch check, in the same transaction)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.fence = Fence()

    # -- the one staleness rule -------------------------------------------------------------

    def _holder_superseded(self) -> ColumnElement[bool]:
        """Held for a pipeline whose epoch moved on (reclaimed), or which is no longer running."""
        p = pipelines.c
        live = exists().where(p.id == q.holder_pipeline_id, p.epoch == q.holder_epoch,
                              p.status == literal_column("'running'"))
        return and_(q.holder_pipeline_id.isnot(None), ~live)

    @retried
    def _stale_condition(self, legacy_seconds: float | None = None) -> ColumnElement[bool]:
        """``processing`` and: heartbeat expired, holder superseded, or (no heartbeat deadline
        at all) started more than ``legacy_seconds`` (default 10 min) ago."""
        legacy = LEGACY_STALE_SECONDS if legacy_seconds is None else float(legacy_seconds)
        now = self.dialect.now()
        return and_(q.status == PROCESSING, or_(
            and_(q.heartbeat_deadline.isnot(None), q.heartbeat_deadline < now),
            and_(q.heartbeat_deadline.is_(None),
                 func.coalesce(q.started_at, q.updated_at) < self.dialect.now_plus(-legacy)),
            self._holder_superseded(),
        ))

    def _stale_reason(self, legacy_seconds: float | None) -> ColumnElement[str]:
        legacy = LEGACY_STALE_SECONDS if legacy_seconds is None else float(legacy_seconds)
        return case(
            (self._holder_superseded(), literal("its pipeline was reclaimed or finished")),
            (q.heartbeat_deadline.isnot(None), literal("heartbeat expired")),
            else_=literal(f"no heartbeat deadline; started more than {legacy:g} s ago"),
        )

    # -- enqueue and claim ------------------------------------------------------------------

    @retried
    def enqueue(
        self, queue: str, payloads: Iterable[Any], *, dedupe_keys: Sequence[str | None] | None = None,
        max_attempts: int = 3, own: Ownership | None = None,
    ) -> list[int]:
        """Add items; with ``dedupe_keys`` an item already in the queue is not added again.
        With ``own`` the insert is fenced by that pipeline's epoch."""
        payloads = list(payloads)
        keys = list(dedupe_keys) if dedupe_keys is not None else [None] * len(payloads)
        if len(keys) != len(payloads):
            raise ValueError("dedupe_keys must match payloads one to one")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        ids: list[int] = []
        with self.write() as conn:
            if own is not None:
                self.fence.check(conn, own)
            for payload, key in zip(payloads, keys, strict=True):
                stmt = self.dialect.insert(queue_items).values(
                    queue=queue, dedupe_key=key, payload=payload, status=QueueStatus.READY, attempts=0,
                    max_attempts=max_attempts, created_at=self.dialect.now(), updated_at=self.dialect.now(),
                )
                stmt = stmt.on_conflict_do_nothing(index_elements=["queue", "dedupe_key"]).returning(q.id)
                row = conn.execute(stmt).first()
                if row is not None:
                    ids.append(row.id)
        return ids

    @retried
    def item_ids(self, queue: str, dedupe_keys: Sequence[str]) -> list[int]:
        """The ids of the items with these dedupe keys, in the keys' order (missing keys are skipped)."""
        found: dict[str, int] = {}
        with self.read() as conn:
            for part in chunks(list(dedupe_keys)):
                found.update((r.dedupe_key, r.id) for r in conn.execute(
                    select(q.dedupe_key, q.id).where(q.queue == queue, q.dedupe_key.in_(list(part)))))
        return [found[k] for k in dedupe_keys if k in found]

    @retried
    def claim(
        self, queue: str, worker: str, *, limit: int = 1, heartbeat_timeout: float = 600.0,
        own: Ownership | None = None, legacy_stale_seconds: float | None = None,
    ) -> list[QueueItem]:
        """Take up to ``limit`` items: stale ``processing`` items first, then ready ones whose
        ``available_at`` has come. Concurrent claimers never get the same item.

        Taking over a stale item is one transition (processing -> processing, a new worker)
        and counts an attempt; a stale item that has used its attempts becomes ``dead``.
        With ``own`` the claim is fenced by that pipeline's epoch and the items carry it.
        """
        if limit < 1:
            return []
        now = self.dialect.now()
        with self.write() as conn:
            if own is not None:
                self.fence.check(conn, own)
            if is_retry():  # the store re-runs this call: a first attempt whose commit landed already claimed
                held_for = (and_(q.holder_pipeline_id == own.pipeline_id, q.holder_epoch == own.epoch) if own
                            else q.holder_pipeline_id.is_(None))
                mine = conn.execute(select(queue_items).where(
                    q.queue == queue, q.status == PROCESSING, q.worker == worker, held_for)).all()
                if mine:
                    return sorted((QueueItem.from_row(r._mapping) for r in mine), key=lambda i: i.id)
            stale = conn.execute(
                select(q.id, q.status, q.worker, q.attempts, q.max_attempts, q.queue, q.started_at, q.payload,
                       self._stale_reason(legacy_stale_seconds).label("reason"))
                .where(q.queue == queue, self._stale_condition(legacy_stale_seconds))
                .order_by(q.id).limit(limit).with_for_update(skip_locked=True, of=queue_items)
            ).all()
            exhausted = [r for r in stale if r.attempts >= r.max_attempts]
            taken: dict[int, Any] = {r.id: r for r in stale if r.attempts < r.max_attempts}
            if len(taken) < limit:
                for r in conn.execute(
                    select(q.id, q.status, q.worker)
                    .where(q.queue == queue, q.status == READY, q.attempts < q.max_attempts,
                           or_(q.available_at.is_(None), q.available_at <= now))
                    .order_by(q.id).limit(limit - len(taken)).with_for_update(skip_locked=True, of=queue_items)
                ):
                    taken[r.id] = r
            if exhausted:
                self._reset_rows(conn, exhausted, reason="claim found it stale")
            if not taken:
                return []
            rows = conn.execute(
                update(queue_items)
                .where(q.id.in_(list(taken)), q.status.in_(UNFINISHED_QUEUE_STATUSES))
                .values(status=QueueStatus.PROCESSING, worker=worker, attempts=q.attempts + 1, started_at=now,
                        updated_at=now,
                        completed_at=None, available_at=None,
                        heartbeat_deadline=self.dialect.now_plus(heartbeat_timeout),
                        holder_pipeline_id=own.pipeline_id if own else None, holder_epoch=own.epoch if own else None)
                .returning(*queue_items.c)
            ).all()
            items = sorted((QueueItem.from_row(r._mapping) for r in rows), key=lambda i: i.id)
            self.record_transitions(conn, [
                {"entity_type": "queue_item", "entity_id": i.id, "pipeline_id": i.holder_pipeline_id,
                 "from_status": taken[i.id].status, "to_status": QueueStatus.PROCESSING,
                 "event": "claimed" if taken[i.id].status == QueueStatus.READY else "claimed_stale",
                 "data": {"worker": worker, "attempt": i.attempts, "epoch": i.holder_epoch,
                          **({"previous_worker": taken[i.id].worker, "reason": taken[i.id].reason}
                             if taken[i.id].status != QueueStatus.READY else {})}}
                for i in items
            ])
            corrupt = [i for i in items if isinstance(i.payload, CorruptJson)]
            if corrupt:
                self._bury_corrupt(conn, corrupt)
        return [i for i in items if not isinstance(i.payload, CorruptJson)]

    def _bury_corrupt(self, conn: Connection, items: Sequence[QueueItem]) -> None:
        """processing -> dead, in the claim's transaction, for items whose payload does not decode: no attempt
        can succeed on them, so retrying would only spend the attempts. The row and its raw payload stay,
        for an operator to repair and revive with ``recovery-ext retry-dead``; the other items go on."""
        now = self.dialect.now()
        reasons = {i.id: f"payload is not valid JSON ({i.payload.error})" for i in items}
        for item in items:
            conn.execute(update(queue_items).where(q.id == item.id, q.status == PROCESSING)
                         .values(status=QueueStatus.DEAD, worker=None, heartbeat_deadline=None, holder_pipeline_id=None,
                                 holder_epoch=None, last_error=reasons[item.id][:2000], last_error_at=now,
                                 updated_at=now))
        self.record_transitions(conn, [
            {"entity_type": "queue_item", "entity_id": i.id, "pipeline_id": i.holder_pipeline_id,
             "from_status": QueueStatus.PROCESSING, "to_status": QueueStatus.DEAD, "event": "corrupt",
             "data": {"reason": reasons[i.id]}} for i in items])
        self.record_events(conn, [
            {"kind": "item_dead", "queue_item_id": i.id, "payload": {"queue": i.queue, "reason": reasons[i.id],
                                                                    "attempts": i.attempts}} for i in items])

    # -- a worker's writes (both fences) ----------------------------------------------------

    def _fence_item(self, conn: Connection, item: QueueItem) -> Any:
        """Check the holding pipeline's epoch, then lock the item row and return its current state."""
        if item.holder_pipeline_id is not None:
            self.fence.check(conn, Ownership(item.holder_pipeline_id, item.holder_epoch or 0, item.worker or ""))
        current = conn.execute(
            select(q.status, q.worker, q.attempts).where(q.id == item.id).with_for_update()
        ).first()
        if current is None:
            raise NotFound(f"no queue item {item.id}")
        return current

    @staticmethod
    def _holds(item: QueueItem, current: Any) -> bool:
        return bool(current.status == QueueStatus.PROCESSING and current.worker == item.worker
                    and current.attempts == item.attempts)

    @staticmethod
    def _finished_by(item: QueueItem, current: Any, statuses: tuple[str, ...]) -> bool:
        """This very attempt already finished the item (a retried call whose first commit landed)."""
        return current.status in statuses and current.worker == item.worker and current.attempts == item.attempts

    @staticmethod
    def _unheld(item: QueueItem, current: Any) -> bool:
        """Reset by a stale monitor and not claimed since (a claim would have counted an attempt)."""
        return (current.status in (QueueStatus.READY, QueueStatus.DEAD) and current.worker is None
                and current.attempts == item.attempts)

    @staticmethod
    def _taken_over(item: QueueItem, current: Any) -> ItemTakenOver:
        return ItemTakenOver(
            f"queue item {item.id} is no longer held by {item.worker} (attempt {item.attempts}); "
            f"it is {current.status} under {current.worker or 'nobody'} (attempt {current.attempts})",
            owner=current.worker, item_id=item.id,
        )

    @retried
    def heartbeat_item(self, item: QueueItem, *, timeout: float) -> None:
        """Extend the item's heartbeat. An item a stale monitor reset but nobody claimed since is
        taken back (a recorded transition, no new attempt): its worker is evidently alive."""
        with self.write() as conn:
            current = self._fence_item(conn, item)
            deadline = self.dialect.now_plus(timeout)
            if self._holds(item, current):
                conn.execute(update(queue_items).where(q.id == item.id)
                             .values(heartbeat_deadline=deadline, updated_at=self.dialect.now()))
                return
            if not (self._unheld(item, current) and current.status == QueueStatus.READY):
                raise self._taken_over(item, current)
            conn.execute(update(queue_items).where(q.id == item.id).values(
                status=QueueStatus.PROCESSING, worker=item.worker, heartbeat_deadline=deadline, available_at=None,
                holder_pipeline_id=item.holder_pipeline_id, holder_epoch=item.holder_epoch,
                updated_at=self.dialect.now()))
            self.record_transitions(conn, [{"entity_type": "queue_item", "entity_id": item.id,
                                            "pipeline_id": item.holder_pipeline_id, "from_status": QueueStatus.READY,
                                            "to_status": QueueStatus.PROCESSING, "event": "reacquired",
                                            "data": {"worker": item.worker, "attempt": item.attempts}}])

    @retried
    def complete_item(self, item: QueueItem, result: Any = None) -> str:
        """processing -> completed with its result; clears the error.

        Returns the status the item came from: ``processing``, or ``ready``/``dead`` when a stale
        monitor had reset it and nobody took it over (the late result is kept, not discarded).
        """
        with self.write() as conn:
            current = self._fence_item(conn, item)
            if self._finished_by(item, current, (QueueStatus.COMPLETED,)):
                return QueueStatus.PROCESSING
            if not (self._holds(item, current) or self._unheld(item, current)):
                raise self._taken_over(item, current)
            conn.execute(update(queue_items).where(q.id == item.id).values(
                status=QueueStatus.COMPLETED, result=result, completed_at=self.dialect.now(),
                updated_at=self.dialect.now(),
                worker=item.worker, heartbeat_deadline=None, available_at=None, last_error=None))
            on_time = current.status == QueueStatus.PROCESSING
            self.record_transitions(conn, [{"entity_type": "queue_item", "entity_id": item.id,
                                            "pipeline_id": item.holder_pipeline_id,
                                            "from_status": current.status, "to_status": QueueStatus.COMPLETED,
                                            "event": QueueStatus.COMPLETED if on_time else "completed_late",
                                            "data": {"worker": item.worker, "attempt": item.attempts}}])
        return str(current.status)

    @retried
    def fail_item(self, item: QueueItem, error: str, *, retryable: bool = True,
                  backoff: Backoff | None = None) -> str:
        """A failed attempt: ``ready`` again after a jittered exponential delay (``available_at``),
        ``dead`` at max attempts, ``failed`` if permanent. An item already reset and not claimed
        since keeps its status; that status is returned."""
        message = redact(error)[:4000]
        if not retryable:
            target = QueueStatus.FAILED
        elif item.attempts >= item.max_attempts:
            target = QueueStatus.DEAD
        else:
            target = QueueStatus.READY
        delay = (backoff or default_retry_backoff()).delay(item.attempts) if target == QueueStatus.READY else None
        with self.write() as conn:
            current = self._fence_item(conn, item)
            if not self._holds(item, current):
                finished = self._finished_by(item, current, (QueueStatus.DEAD, QueueStatus.FAILED))
                if self._unheld(item, current) or finished:
                    return str(current.status)
                raise self._taken_over(item, current)
            conn.execute(update(queue_items).where(q.id == item.id).values(
                status=target, worker=None if target == QueueStatus.READY else item.worker, last_error=message,
                last_error_at=self.dialect.now(), heartbeat_deadline=None, updated_at=self.dialect.now(),
                available_at=self.dialect.now_plus(delay) if delay is not None else None))
            self.record_transitions(conn, [{"entity_type": "queue_item", "entity_id": item.id,
                                            "pipeline_id": item.holder_pipeline_id,
                                            "from_status": QueueStatus.PROCESSING, "to_status": target,
                                            "event": QueueStatus.FAILED,
                                            "data": {"error": message, "attempt": item.attempts,
                                                     **({"retry_in_seconds": round(delay, 3)} if delay else {})}}])
            if target == QueueStatus.DEAD:
                self.record_events(conn, [{"kind": "item_dead", "queue_item_id": item.id,
                                           "payload": {"queue": item.queue, "error": message,
                                                       "attempts": item.attempts}}])
        return target

    # -- stale items --------------------------------------------------------------------------

    def _stale_query(self, columns: Sequence[Any], *, queue: str | None, older_than_seconds: float | None,
                     item_id: int | None, holder: int | None) -> Select[Any]:
        query = select(*columns).where(self._stale_condition(older_than_seconds))
        if queue is not None:
            query = query.where(q.queue == queue)
        if item_id is not None:
            query = query.where(q.id == item_id)
        if holder is not None:
            query = query.where(q.holder_pipeline_id == holder)
        return query.order_by(q.started_at, q.id)

    @retried
    def stale_items(self, *, queue: str | None = None, older_than_seconds: float | None = None,
                    item_id: int | None = None) -> list[StaleItem]:
        """Stuck items by the one rule; ``older_than_seconds`` is the threshold for rows without a
        heartbeat deadline (default 10 min)."""
        query = self._stale_query([*queue_items.c, self._stale_reason(older_than_seconds).label("stale_reason")],
                                  queue=queue, older_than_seconds=older_than_seconds, item_id=item_id, holder=None)
        with self.read() as conn:
            return [StaleItem.from_row(r._mapping) for r in conn.execute(query)]

    @retried
    def reset_stale(
        self, *, queue: str | None = None, older_than_seconds: float | None = None, item_id: int | None = None,
        reason: str = "stale", limit: int = 10_000,
    ) -> list[ResetItem]:
        """Stale items go back to ``ready`` (claimable at once, worker cleared); those at their
        maximum attempts become ``dead``."""
        return self._reset_stale(queue=queue, older_than_seconds=older_than_seconds, item_id=item_id,
                                 reason=reason, limit=limit, holder=None)

    @retried
    def release_superseded(self, own: Ownership, *, queue: str | None = None) -> list[ResetItem]:
        """A resume's first act: items held by any earlier epoch of its pipeline (or stale for any
        other reason while held by it) go back to ``ready``. Fenced by ``own``."""
        return self._reset_stale(queue=queue, older_than_seconds=None, item_id=None, limit=10_000, own=own,
                                 reason=f"pipeline {own.pipeline_id} was reclaimed (now epoch {own.epoch})",
                                 holder=own.pipeline_id)

    def _reset_stale(self, *, queue: str | None, older_than_seconds: float | None, item_id: int | None,
                     reason: str, limit: int, holder: int | None,
                     own: Ownership | None = None) -> list[ResetItem]:
        columns = [q.id, q.queue, q.worker, q.started_at, q.attempts, q.max_attempts, q.payload,
                   self._stale_reason(older_than_seconds).label("reason")]
        with self.write() as conn:
            if own is not None:
                self.fence.check(conn, own)
            found = conn.execute(self._stale_query(columns, queue=queue, older_than_seconds=older_than_seconds,
                                                   item_id=item_id, holder=holder)
                                 .limit(limit).with_for_update(skip_locked=True, of=queue_items)).all()
            return self._reset_rows(conn, found, reason=reason)

    def _reset_rows(self, conn: Connection, found: Sequence[Any], *, reason: str) -> list[ResetItem]:
        """processing -> ready (or dead at max attempts) for rows this transaction has locked."""
        if not found:
            return []
        target = case((q.attempts >= q.max_attempts, literal(QueueStatus.DEAD, Text)),
                      else_=literal(QueueStatus.READY, Text))
        note = f"{RESET_NOTE}: {reason}"
        rows = conn.execute(
            update(queue_items)
            .where(q.id.in_([r.id for r in found]), q.status == QueueStatus.PROCESSING)
            .values(status=target, worker=None, heartbeat_deadline=None, available_at=None, holder_pipeline_id=None,
                    holder_epoch=None, last_error=note, last_error_at=self.dialect.now(), updated_at=self.dialect.now())
            .returning(q.id, q.status)
        ).all()
        by_id = {r.id: r for r in found}
        reset = [ResetItem(r.id, by_id[r.id].queue, by_id[r.id].worker, by_id[r.id].started_at, by_id[r.id].attempts,
                           by_id[r.id].max_attempts, r.status, by_id[r.id].payload, by_id[r.id].reason)
                 for r in sorted(rows, key=lambda r: r.id)]
        self.record_transitions(conn, [
            {"entity_type": "queue_item", "entity_id": r.id, "from_status": QueueStatus.PROCESSING,
             "to_status": r.new_status,
             "event": "reset_stale", "data": {"reason": note, "stale": r.reason, "worker": r.worker}} for r in reset
        ])
        self.record_events(conn, [
            {"kind": "item_dead" if r.new_status == QueueStatus.DEAD else "item_reset", "queue_item_id": r.id,
             "payload": {"queue": r.queue, "reason": note, "stale": r.reason, "attempts": r.attempts}} for r in reset
        ])
        return reset

    # -- waiting for a pipeline's documents ---------------------------------------------------

    @retried
    def unfinished_items(self, ids: Sequence[int]) -> list[QueueItem]:
        """Those of ``ids`` that still need work: ``processing``, or ``ready`` with attempts left."""
        found: list[QueueItem] = []
        needs_work = or_(q.status == PROCESSING, and_(q.status == READY, q.attempts < q.max_attempts))
        with self.read() as conn:
            for part in chunks(sorted(set(ids))):
                found.extend(QueueItem.from_row(r._mapping) for r in conn.execute(
                    select(queue_items).where(q.id.in_(list(part)), needs_work)))
        return sorted(found, key=lambda i: i.id)

    @retried
    def seconds_until_claimable(self, queue: str) -> float | None:
        """Until the next waiting retry or the next heartbeat deadline of a held item, on the
        database clock; ``None`` when nothing in the queue is waiting or held."""
        now = self.dialect.now()

        def until(column: Any) -> ColumnElement[float]:
            return func.min(type_coerce(self.dialect.seconds_between(now, column), Float))

        with self.read() as conn:
            retry = conn.scalar(select(until(q.available_at))
                                .where(q.queue == queue, q.status == READY, q.available_at.isnot(None)))
            held = conn.scalar(select(until(q.heartbeat_deadline))
                               .where(q.queue == queue, q.status == PROCESSING, q.heartbeat_deadline.isnot(None)))
        waits = [max(0.0, float(v)) for v in (retry, held) if v is not None]
        return min(waits) if waits else None

    # -- operator actions and reads -----------------------------------------------------------

    @retried
    def retry_dead(self, ids: Sequence[int] | None = None, *, queue: str | None = None) -> list[int]:
        """dead -> ready with attempts cleared; ``ids=None`` retries every dead item."""
        with self.write() as conn:
            where = [q.status == literal_column("'dead'")]
            if ids is not None:
                where.append(q.id.in_(list(ids)))
            if queue is not None:
                where.append(q.queue == queue)
            rows = conn.execute(
                update(queue_items).where(*where)
                .values(status=QueueStatus.READY, attempts=0, worker=None, available_at=None,
                        updated_at=self.dialect.now())
                .returning(q.id)
            ).all()
            retried = sorted(r.id for r in rows)
            missing = set(ids) - set(retried) if ids is not None else set()
            if missing:  # raised inside the transaction: it rolls back, a rejected command changes nothing
                raise IllegalTransition(f"queue items {sorted(missing)} are not dead; only dead items can be retried "
                                        "(nothing was changed)")
            self.record_transitions(conn, [
                {"entity_type": "queue_item", "entity_id": i, "from_status": QueueStatus.DEAD,
                 "to_status": QueueStatus.READY,
                 "event": "manual_retry", "data": {"attempts_cleared": True}} for i in retried
            ])
        return retried

    @retried
    def get_item(self, item_id: int) -> QueueItem:
        with self.read() as conn:
            row = conn.execute(select(queue_items).where(q.id == item_id)).first()
        if row is None:
            raise NotFound(f"no queue item {item_id}")
        return QueueItem.from_row(row._mapping)

    @retried
    def list_items(self, queue: str, *, status: str | None = None) -> list[QueueItem]:
        query = select(queue_items).where(q.queue == queue).order_by(q.id)
        if status:
            query = query.where(q.status == status)
        with self.read() as conn:
            return [QueueItem.from_row(r._mapping) for r in conn.execute(query)]

    @retried
    def waiting_items(self, *, limit: int = 100) -> list[QueueItem]:
        """Failed items waiting for their retry delay, the next one first (for ``status``)."""
        query = (select(queue_items).where(q.status == READY, q.available_at > self.dialect.now())
                 .order_by(q.available_at, q.id).limit(limit))
        with self.read() as conn:
            return [QueueItem.from_row(r._mapping) for r in conn.execute(query)]

    @retried
    def count_ready(self, queue: str, *, waiting: bool = False) -> int:
        """Ready items claimable now; with ``waiting=True`` those still waiting for their retry delay."""
        now = self.dialect.now()
        due = or_(q.available_at.is_(None), q.available_at <= now)
        with self.read() as conn:
            return conn.scalar(select(func.count()).where(q.queue == queue, q.status == READY,
                                                          ~due if waiting else due)) or 0


def validate_backoff(initial: float, maximum: float, jitter: float) -> wait_jittered_exponential:
    """The retry backoff of a queue, from op config; a clear error names the bad value."""
    for name, value in (("retry_initial_delay", initial), ("retry_max_delay", maximum)):
        if not (value == value) or value < 0 or value > 7 * 86400:  # NaN, negative, over a week
            raise ConfigurationError(f"{name} must be between 0 and 604800 seconds, got {value!r}")
    return wait_jittered_exponential(initial, max_delay=maximum, jitter=jitter)
