"""The engine, transactions, driver-error wrapping and the write helpers every store part shares."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, create_engine, insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from . import migrations
from .dialects import Dialect
from .errors import StoreError, StoreUnavailable
from .redaction import redact
from .schema import events, transitions

log = logging.getLogger("recovery_ext.store")

# SQLite allows 32766 bound variables; PostgreSQL 65535. Chunks stay well below both.
CHUNK = 2000


def chunks(values: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Database:
    """Owns the engine; every store operation runs in one of its transactions."""

    def __init__(self, url: str, *, echo: bool = False, engine: Engine | None = None) -> None:
        self.dialect = Dialect.for_url(url)
        self.url = self.dialect.url
        if engine is None:
            engine = create_engine(self.url, echo=echo, **self.dialect.engine_options())
            self.dialect.configure(engine)
        self.engine = engine

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url.render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- transactions ---------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite); commits on success."""
        with self._wrap_errors():
            with self.engine.connect().execution_options(rx_write=True) as conn:
                with conn.begin():
                    yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._wrap_errors():
            with self.engine.connect() as conn:
                with conn.begin():
                    yield conn

    @contextmanager
    def _wrap_errors(self) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            raise self.wrap_error(exc) from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {redact(str(exc))}") from exc

    def wrap_error(self, exc: DBAPIError) -> StoreError:
        message = redact(str(getattr(exc, "orig", exc)) or type(exc).__name__).strip().splitlines()[0]
        if exc.connection_invalidated or self.dialect.is_transient(exc) or _is_connect_failure(exc):
            return StoreUnavailable(f"database unavailable: {message}")
        return StoreError(f"database error: {message}")

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> list[migrations.Migration]:
        with self._wrap_errors():
            return migrations.apply_migrations(self.engine, self.dialect)

    def pending_migrations(self) -> list[migrations.Migration]:
        with self._wrap_errors():
            return migrations.pending_migrations(self.engine, self.dialect)

    # -- history helpers (always inside the caller's transaction) -------------------------

    def record_transitions(self, conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
        batch = [
            {
                "entity_type": row["entity_type"],
                "entity_id": row["entity_id"],
                "pipeline_id": row.get("pipeline_id"),
                "from_status": row.get("from_status"),
                "to_status": row["to_status"],
                "event": row["event"],
                "data": row.get("data"),
                "at": None,
            }
            for row in rows
        ]
        for part in chunks(batch):
            conn.execute(insert(transitions).values(at=self.dialect.now()), [_without_at(r) for r in part])

    def record_events(self, conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
        batch = [
            {
                "kind": row["kind"],
                "pipeline_id": row.get("pipeline_id"),
                "queue_item_id": row.get("queue_item_id"),
                "payload": row.get("payload") or {},
            }
            for row in rows
        ]
        for part in chunks(batch):
            conn.execute(insert(events).values(created_at=self.dialect.now()), list(part))

    def upsert(self, conn: Connection, table, rows: Sequence[dict[str, Any]], *, keys: Sequence[str]) -> None:
        """Insert or update by primary key, so re-running a node writes the same rows again."""
        for row in rows:
            stmt = self.dialect.insert(table).values(**row, updated_at=self.dialect.now())
            update_cols = {c: stmt.excluded[c] for c in row if c not in keys}
            update_cols["updated_at"] = self.dialect.now()
            conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=update_cols))

    def record_event(self, kind: str, payload: dict[str, Any] | None = None, *, pipeline_id: int | None = None) -> None:
        with self.write() as conn:
            self.record_events(conn, [{"kind": kind, "payload": payload, "pipeline_id": pipeline_id}])


def _without_at(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "at"}


def _is_connect_failure(exc: DBAPIError) -> bool:
    orig = getattr(exc, "orig", None)
    name = type(orig).__name__ if orig is not None else ""
    # psycopg raises OperationalError without SQLSTATE when the server cannot be reached.
    return name == "OperationalError" and getattr(orig, "sqlstate", None) is None and "sqlite" not in type(orig).__module__
