"""The fenced transaction: what user code inside a recoverable op writes through.

It is opened by :meth:`PipelineOps.fenced`, which first locks the pipeline row and
checks the worker's epoch in the same transaction. A reclaim needs ``FOR UPDATE`` on
that row, so while this transaction is open nobody can take the pipeline over, and once
somebody has, opening it raises :class:`~recovery_ext._errors.OwnershipLost` before any
statement of the caller runs. A superseded worker therefore cannot write through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from recovery_ext._errors import StoreError
from recovery_ext._store.models import Ownership

if TYPE_CHECKING:  # pragma: no cover
    from recovery_ext._store.database import Transactions


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
