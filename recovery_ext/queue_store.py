"""The work queue of seed 003: enqueue, claim (SKIP LOCKED), heartbeat, complete, fail, reset.

``attempts`` counts started attempts: a claim increments it (seed 003: "ocr_attempts
incremented" when processing starts), so an item whose worker died has used one.
Every write a worker makes is fenced by ``(worker, attempts)``: once an item was reset
and claimed again, the first worker's completion changes nothing and raises
:class:`~recovery_ext.errors.OwnershipLost`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, literal, literal_column, or_, select, update

from .database import Database
from .errors import IllegalTransition, NotFound, OwnershipLost
from .models import QueueItem
from .redaction import redact
from .schema import queue_items

q = queue_items.c
PROCESSING = literal_column("'processing'")
READY = literal_column("'ready'")
RESET_NOTE = "Reset by stale monitor"


@dataclass(frozen=True)
class ResetItem:
    id: int
    queue: str
    worker: str | None
    started_at: Any
    attempts: int
    max_attempts: int
    new_status: str
    payload: Any = None


class QueueOps(Database):
    def enqueue(
        self, queue: str, payloads: Iterable[Any], *, dedupe_keys: Sequence[str | None] | None = None,
        max_attempts: int = 3,
    ) -> list[int]:
        """Add items; with ``dedupe_keys`` an item already in the queue is not added again."""
        payloads = list(payloads)
        keys = list(dedupe_keys) if dedupe_keys is not None else [None] * len(payloads)
        if len(keys) != len(payloads):
            raise ValueError("dedupe_keys must match payloads one to one")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        ids: list[int] = []
        with self.write() as conn:
            for payload, key in zip(payloads, keys):
                stmt = self.dialect.insert(queue_items).values(
                    queue=queue, dedupe_key=key, payload=payload, status="ready", attempts=0,
                    max_attempts=max_attempts, created_at=self.dialect.now(), updated_at=self.dialect.now(),
                )
                stmt = stmt.on_conflict_do_nothing(index_elements=["queue", "dedupe_key"]).returning(q.id)
                row = conn.execute(stmt).first()
                if row is not None:
                    ids.append(row.id)
        return ids

    def claim(self, queue: str, worker: str, *, limit: int = 1, heartbeat_timeout: float = 600.0) -> list[QueueItem]:
        """Take the next ``limit`` ready items; concurrent claimers never get the same item."""
        with self.write() as conn:
            ids = [r.id for r in conn.execute(
                select(q.id)
                .where(q.queue == queue, q.status == READY, q.attempts < q.max_attempts)
                .order_by(q.id).limit(limit).with_for_update(skip_locked=True)
            )]
            if not ids:
                return []
            rows = conn.execute(
                update(queue_items)
                .where(q.id.in_(ids), q.status == "ready")
                .values(status="processing", worker=worker, attempts=q.attempts + 1,
                        started_at=self.dialect.now(), updated_at=self.dialect.now(), completed_at=None,
                        heartbeat_deadline=self.dialect.now_plus(heartbeat_timeout))
                .returning(*queue_items.c)
            ).all()
            items = sorted((QueueItem.from_row(r._mapping) for r in rows), key=lambda i: i.id)
            self.record_transitions(conn, [
                {"entity_type": "queue_item", "entity_id": i.id, "from_status": "ready", "to_status": "processing",
                 "event": "claimed", "data": {"worker": worker, "attempt": i.attempts}} for i in items
            ])
        return items

    def _fenced_update(self, conn, item: QueueItem, **values):
        row = conn.execute(
            update(queue_items)
            .where(q.id == item.id, q.status == "processing", q.worker == item.worker, q.attempts == item.attempts)
            .values(updated_at=self.dialect.now(), **values)
            .returning(q.id)
        ).first()
        if row is None:
            current = conn.execute(select(q.status, q.worker, q.attempts).where(q.id == item.id)).first()
            if current is None:
                raise NotFound(f"no queue item {item.id}")
            raise OwnershipLost(
                f"queue item {item.id} is no longer held by {item.worker} (attempt {item.attempts}); "
                f"it is {current.status} under {current.worker or 'nobody'} (attempt {current.attempts})",
                owner=current.worker,
            )

    def heartbeat_item(self, item: QueueItem, *, timeout: float) -> None:
        with self.write() as conn:
            self._fenced_update(conn, item, heartbeat_deadline=self.dialect.now_plus(timeout))

    def complete_item(self, item: QueueItem, result: Any = None) -> None:
        """processing -> completed with its result; clears the error (seed 003 completion tracking)."""
        with self.write() as conn:
            self._fenced_update(conn, item, status="completed", result=result, completed_at=self.dialect.now(),
                                heartbeat_deadline=None, last_error=None)
            self.record_transitions(conn, [{"entity_type": "queue_item", "entity_id": item.id,
                                            "from_status": "processing", "to_status": "completed",
                                            "event": "completed", "data": {"worker": item.worker}}])

    def fail_item(self, item: QueueItem, error: str, *, retryable: bool = True) -> str:
        """A failed attempt: back to ready, ``dead`` at max attempts, ``failed`` if permanent."""
        message = redact(error)[:4000]
        if not retryable:
            target = "failed"
        elif item.attempts >= item.max_attempts:
            target = "dead"
        else:
            target = "ready"
        with self.write() as conn:
            self._fenced_update(conn, item, status=target, worker=None if target == "ready" else item.worker,
                                last_error=message, last_error_at=self.dialect.now(), heartbeat_deadline=None)
            self.record_transitions(conn, [{"entity_type": "queue_item", "entity_id": item.id,
                                            "from_status": "processing", "to_status": target, "event": "failed",
                                            "data": {"error": message, "attempt": item.attempts}}])
            if target == "dead":
                self.record_events(conn, [{"kind": "item_dead", "queue_item_id": item.id,
                                           "payload": {"queue": item.queue, "error": message,
                                                       "attempts": item.attempts}}])
        return target

    def _stale_condition(self, queue: str | None, older_than_seconds: float | None,
                         held_by: Sequence[str] = ()):
        now = self.dialect.now()
        conds = [and_(q.heartbeat_deadline.isnot(None), q.heartbeat_deadline < now)]
        if older_than_seconds is not None:
            conds.append(q.started_at < self.dialect.now_plus(-float(older_than_seconds)))
        for owner in held_by:
            conds.append(q.worker.like(f"{owner}:%"))
        where = [q.status == PROCESSING, or_(*conds)]
        if queue is not None:
            where.append(q.queue == queue)
        return and_(*where)

    def stale_items(self, *, queue: str | None = None, older_than_seconds: float | None = None,
                    item_id: int | None = None) -> list[QueueItem]:
        query = select(queue_items).where(self._stale_condition(queue, older_than_seconds)).order_by(q.started_at)
        if item_id is not None:
            query = query.where(q.id == item_id)
        with self.read() as conn:
            return [QueueItem.from_row(r._mapping) for r in conn.execute(query)]

    def reset_stale(
        self, *, queue: str | None = None, older_than_seconds: float | None = None, item_id: int | None = None,
        reason: str = "stale", limit: int = 10_000, held_by: Sequence[str] = (),
    ) -> list[ResetItem]:
        """Processing items whose heartbeat expired (or that started before the threshold, or whose
        worker belongs to a superseded run in ``held_by``) go back to ``ready`` with the worker
        cleared; those at their maximum attempts become ``dead``."""
        note = f"{RESET_NOTE}: {reason}"
        with self.write() as conn:
            query = (select(q.id, q.worker).where(self._stale_condition(queue, older_than_seconds, held_by))
                     .order_by(q.started_at).limit(limit).with_for_update(skip_locked=True))
            if item_id is not None:
                query = query.where(q.id == item_id)
            previous_workers = {r.id: r.worker for r in conn.execute(query)}
            ids = list(previous_workers)
            if not ids:
                return []
            target = case((q.attempts >= q.max_attempts, literal("dead")), else_=literal("ready"))
            rows = conn.execute(
                update(queue_items)
                .where(q.id.in_(ids), q.status == "processing")
                .values(status=target, worker=None, heartbeat_deadline=None, last_error=note,
                        last_error_at=self.dialect.now(), updated_at=self.dialect.now())
                .returning(q.id, q.queue, q.status, q.attempts, q.max_attempts, q.started_at, q.payload)
            ).all()
            reset = [ResetItem(r.id, r.queue, previous_workers.get(r.id), r.started_at, r.attempts, r.max_attempts,
                               r.status, r.payload) for r in rows]
            self.record_transitions(conn, [
                {"entity_type": "queue_item", "entity_id": r.id, "from_status": "processing",
                 "to_status": r.new_status, "event": "reset_stale", "data": {"reason": note}} for r in reset
            ])
            self.record_events(conn, [
                {"kind": "item_dead" if r.new_status == "dead" else "item_reset", "queue_item_id": r.id,
                 "payload": {"queue": r.queue, "reason": note, "attempts": r.attempts}} for r in reset
            ])
        return reset

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
                .values(status="ready", attempts=0, worker=None, updated_at=self.dialect.now())
                .returning(q.id)
            ).all()
            retried = sorted(r.id for r in rows)
            missing = set(ids) - set(retried) if ids is not None else set()
            if missing:  # raised inside the transaction: it rolls back, a rejected command changes nothing
                raise IllegalTransition(f"queue items {sorted(missing)} are not dead; only dead items can be retried "
                                        "(nothing was changed)")
            self.record_transitions(conn, [
                {"entity_type": "queue_item", "entity_id": i, "from_status": "dead", "to_status": "ready",
                 "event": "manual_retry", "data": {"attempts_cleared": True}} for i in retried
            ])
        return retried

    def get_item(self, item_id: int) -> QueueItem:
        with self.read() as conn:
            row = conn.execute(select(queue_items).where(q.id == item_id)).first()
        if row is None:
            raise NotFound(f"no queue item {item_id}")
        return QueueItem.from_row(row._mapping)

    def list_items(self, queue: str, *, status: str | None = None) -> list[QueueItem]:
        query = select(queue_items).where(q.queue == queue).order_by(q.id)
        if status:
            query = query.where(q.status == status)
        with self.read() as conn:
            return [QueueItem.from_row(r._mapping) for r in conn.execute(query)]

    def count_ready(self, queue: str) -> int:
        with self.read() as conn:
            return conn.scalar(select(func.count()).where(q.queue == queue, q.status == READY)) or 0
