"""The fence, and the fenced transaction: what user code inside a recoverable op writes through (the handle,
:class:`~recovery_ext._store.models.FencedTransaction`, is one of the store's values).

The transaction is opened by :meth:`PipelineNodes.fenced`, which first locks the pipeline row and
checks the worker's epoch in the same transaction. A reclaim needs ``FOR UPDATE`` on
that row, so while this transaction is open nobody can take the pipeline over, and once
somebody has, opening it raises :class:`~recovery_ext._errors.OwnershipLost` before any
statement of the caller runs. A superseded worker therefore cannot write through it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from recovery_ext._errors import NotFound, OwnershipLost
from recovery_ext._store.database import is_retry
# FencedTransaction as itself: the handle's old home (a value of models.py now; the store's pipelines open it).
from recovery_ext._store.models import FencedTransaction as FencedTransaction, Ownership
from recovery_ext._store.schema import pipelines
from recovery_ext._store.statuses import PipelineStatus


class Fence:
    """The check every write for an owner starts with: lock the pipeline row against a reclaim and check that the
    owner still holds it, in the writer's own transaction. A reclaim bumps the epoch under ``FOR UPDATE``, so the
    two are serialized: a superseded worker's write changes nothing and raises OwnershipLost."""

    def check(self, conn: Connection, own: Ownership, *, for_update: bool = False,
              finished_ok: bool = False, completed_ok: bool = False) -> str:
        """Lock the pipeline row against reclaim and check that ``own`` still holds it; returns its status.

        ``for_update=True`` when this transaction will UPDATE the pipeline row: it takes
        that UPDATE's lock (``FOR NO KEY UPDATE``) now instead of upgrading a share lock
        later, which is what deadlocked sibling nodes. ``finished_ok``: on a retried call,
        a pipeline this owner already finished (the first attempt's commit landed) is
        returned as its status instead of raising. ``completed_ok``: a pipeline this owner
        and epoch completed is returned as ``"completed"`` on any call.
        """
        query = select(pipelines.c.epoch, pipelines.c.owner, pipelines.c.status).where(
            pipelines.c.id == own.pipeline_id)
        query = (query.with_for_update(key_share=True) if for_update
                 else query.with_for_update(read=True, key_share=True))
        row = conn.execute(query).first()
        if row is None:
            raise NotFound(f"no pipeline {own.pipeline_id}")
        if (finished_ok and is_retry() and row.epoch == own.epoch and row.owner == own.owner
                and row.status in (PipelineStatus.COMPLETED, PipelineStatus.FAILED)):
            return str(row.status)
        if (completed_ok and row.epoch == own.epoch and row.owner == own.owner
                and row.status == PipelineStatus.COMPLETED):
            return str(row.status)
        if row.epoch != own.epoch or row.status != PipelineStatus.RUNNING:
            raise lost(own, row.owner, row.epoch, row.status)
        return str(row.status)


# The fence as fixed SQL on SQLite's driver connection, inside a write transaction (BEGIN IMMEDIATE holds the one
# write lock already, so no row lock is needed): a batched write's SQLAlchemy select cost more client CPU than the
# statement itself, and at 64 items in flight that CPU (one GIL) is what limits throughput.
_SQLITE_FENCE = "SELECT epoch, owner, status FROM rx_pipelines WHERE id = ?"


def check_on_sqlite_driver(raw: Any, own: Ownership) -> None:
    """:meth:`Fence.check` (its plain form) on SQLite's driver connection ``raw``, in its write transaction."""
    row = raw.execute(_SQLITE_FENCE, (own.pipeline_id,)).fetchone()
    if row is None:
        raise NotFound(f"no pipeline {own.pipeline_id}")
    epoch, owner, status = row
    if epoch != own.epoch or status != PipelineStatus.RUNNING:
        raise lost(own, owner, epoch, status)


def lost(own: Ownership, owner: str | None, epoch: int, status: str) -> OwnershipLost:
    who = owner if epoch != own.epoch else f"{owner} (pipeline {status})"
    return OwnershipLost(owner=who or "(awaiting resume)", pipeline_id=own.pipeline_id)
