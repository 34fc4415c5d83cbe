"""The fenced transaction: what user code inside a recoverable op writes through.

It is opened by :meth:`PipelineNodes.fenced`, which first locks the pipeline row and
checks the worker's epoch in the same transaction. A reclaim needs ``FOR UPDATE`` on
that row, so while this transaction is open nobody can take the pipeline over, and once
somebody has, opening it raises :class:`~recovery_ext._errors.OwnershipLost` before any
statement of the caller runs. A superseded worker therefore cannot write through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select

from recovery_ext._errors import NotFound, StoreError
from recovery_ext._store.database import is_retry
from recovery_ext._store.models import Ownership
from recovery_ext._store.node_transitions import lost
from recovery_ext._store.schema import pipelines
from recovery_ext._store.statuses import PipelineStatus

if TYPE_CHECKING:  # pragma: no cover
    from recovery_ext._store.database import Transactions


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


class FencedTransaction:
    """One fenced write transaction; usable only inside its ``with`` block."""

    def __init__(self, db: Transactions, conn: Connection, own: Ownership) -> None:
        self._db = db
        self._conn: Connection | None = conn
        self.ownership = own

    @property
    def pipeline_id(self) -> int:
        return self.ownership.pipeline_id

    def _open(self) -> Connection:
        if self._conn is None:
            raise StoreError("this fenced transaction has ended; open a new one with ctx.transaction()")
        return self._conn

    def execute(self, statement: Any, parameters: Any = None) -> Any:
        """Run a SQLAlchemy Core statement inside the fenced transaction."""
        return self._open().execute(statement, parameters)

    def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return self._open().scalar(statement, parameters)

    def upsert(self, table: Any, rows: Sequence[dict[str, Any]], *, keys: Sequence[str]) -> None:
        """Insert or update ``rows`` by ``keys``, so a re-run node writes the same rows again."""
        self._db.upsert(self._open(), table, rows, keys=keys)

    def close(self) -> None:
        self._conn = None
