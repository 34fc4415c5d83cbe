"""Everything that differs between PostgreSQL and SQLite lives here.

One :class:`Dialect` subclass per database, chosen from the URL. The store calls
these hooks and never asks which database it talks to.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import (DateTime, Float, Text, and_, bindparam, case, event, false, func, insert, literal,
                        literal_column, or_, text)
from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.interfaces import Dialect as SqlAlchemyDialect
from sqlalchemy.engine.url import URL
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator, TypeEngine

from recovery_ext._classify.classifier import is_retryable
from recovery_ext._errors import ConfigurationError
from recovery_ext._classify.redaction import redact, redact_url
from recovery_ext._conventions import load_json, storable_json
from recovery_ext._store.models import UNSTORABLE_TEXT, JsonText

# SQLSTATE classes/codes a retry can fix: connection (08), serialization (40001),
# deadlock (40P01), insufficient resources (53), operator intervention (57).
_PG_TRANSIENT_CLASSES = ("08", "53", "57")
_PG_TRANSIENT_CODES = ("40001", "40P01")
_SQLITE_BUSY_CODES = (5, 6, 261, 262, 517)  # SQLITE_BUSY, SQLITE_LOCKED and extended codes
# Connections per process and engine (README "PostgreSQL": connection footprint).
POOL_SIZE = 2
POOL_OVERFLOW = 8
# Rows per INSERT of many rows (SQLite allows 32766 bound variables; a row here binds fewer than 10).
INSERT_CHUNK = 2000


class Dialect:
    """Hooks the store needs from a database."""

    name = "base"
    migrations_folder = ""
    default_connect_timeout = 10.0
    default_statement_timeout = 30.0
    # Data-modifying CTEs (INSERT/UPDATE inside WITH): several writes in one statement, one round trip.
    dml_in_cte = False
    # rx_begin_node / rx_complete_node exist (migration 0008): a node's start and completion in one round trip
    # (``node_transitions`` picks its strategy from this, once per store)
    node_functions = False
    # rx_journal_begin / rx_journal_answer exist (migration 0018): a journaled provider call's two fenced writes in
    # one round trip each (``journal_writes`` picks its strategy from this, once per store)
    journal_functions = False
    # Write many ledger rows through the driver's own executemany: SQLAlchemy's execute costs more than the
    # rows themselves on an in-process database.
    ledger_rows_via_driver = False
    # a read of one statement needs no transaction: each statement is its own snapshot (READ COMMITTED)
    autocommit_reads = False
    # writers wait on row locks, visible in the server's own activity view (pg_stat_activity); SQLite has one
    # writer lock, waited for inside the client
    row_locks = False
    # finished pipelines one retention batch deletes (one transaction)
    prune_batch = 200
    # its text columns keep a NUL character (SQLite's do; PostgreSQL's text refuses one): an item key holding
    # one is refused before its work only where it could not be checkpointed
    text_keeps_nul = False
    # The most bytes an item key may take in an index entry (None: no limit). A PostgreSQL btree entry holds at
    # most 2,704 bytes (a third of a page), beside the pipeline's id and the node's name; the server compresses a
    # long key first (pglz), so a longer key that compresses well fits, and one that does not fails its write
    # after its call was paid. A key is refused only when even LZ77 without entropy coding (zlib's Z_FIXED, which
    # does at least as well as pglz) cannot bring it under this: no key that fitted before is refused.
    key_bytes_max: int | None = None

    def __init__(self, url: URL, *, connect_timeout: float | None = None,
                 statement_timeout: float | None = None) -> None:
        self.url = url
        self.connect_timeout = _timeout("connect_timeout", connect_timeout, self.default_connect_timeout)
        self.statement_timeout = _timeout("statement_timeout", statement_timeout, self.default_statement_timeout)

    def why_unstorable(self, text: str) -> str | None:
        """Why this database's text columns cannot store ``text`` (an item key) as it is, or None when they can: a
        lone surrogate (text decoded from bytes that are not UTF-8 with ``surrogateescape``) has no UTF-8 form on
        either database; a NUL character is refused where ``text_keeps_nul`` is False; a key too long for an index
        entry even compressed (``key_bytes_max``). A key is never altered to fit: two keys must not become one.
        The usual short ASCII key is settled by three string tests."""
        if "\x00" in text and not self.text_keeps_nul:
            return "holds a NUL character, which this database's text cannot store"
        limit = self.key_bytes_max
        if text.isascii():
            if limit is not None and len(text) > limit:
                return self._why_too_long(text.encode("ascii"), limit)
            return None
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            # Python's str keeps surrogate code points apart: one alone (surrogateescape) or both halves of a pair
            # as two code points ("\ud83d\ude00", not the emoji's one) encode to no UTF-8
            return ("holds a lone surrogate: a code point of U+D800-U+DFFF with no UTF-8 form (text decoded from "
                    "bytes that are not UTF-8, or a surrogate pair left as two code points)")
        if limit is not None and len(data) > limit:
            return self._why_too_long(data, limit)
        return None

    def first_unstorable(self, keys: Iterable[str]) -> tuple[str, str] | None:
        """The first of ``keys`` :meth:`why_unstorable` refuses, with why, or None when every one can be stored. Keys
        of plain ASCII text, without a NUL and short enough, the usual ones, are settled together by three string
        tests on their joined text, not one by one (ctx.items checks every key of a run, and a batch's checkpoint
        every key it writes): the slower test runs only when one of them fails."""
        keys = keys if isinstance(keys, list | tuple) else list(keys)  # read twice: a generator would be used up
        joined = "".join(keys)
        limit = self.key_bytes_max
        if (joined.isascii() and ("\x00" not in joined or self.text_keeps_nul)
                and (limit is None or len(joined) <= limit or max(map(len, keys)) <= limit)):
            return None
        for key in keys:
            why = self.why_unstorable(key)
            if why is not None:
                return key, why
        return None

    @staticmethod
    def _why_too_long(data: bytes, limit: int) -> str | None:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_FIXED)
        packed = len(packer.compress(data) + packer.flush())
        if packed <= limit:
            return None  # it may fit compressed, as it did before this check
        return (f"is {len(data):,} bytes of UTF-8 that do not compress to the {limit:,} a key may take in an index "
                "entry of this database")

    def storable_call_key(self, key: str) -> str:
        """``key`` as a paid call's ledger row keeps it: a call is never refused once paid for, nor its batch (a
        key the caller gave ``record_call``, which no item could have). As it is when this database can store it
        (:meth:`why_unstorable`); else a NUL and a lone surrogate as U+FFFD, as a call's other texts, and a key too
        long for an index entry cut to ``key_bytes_max`` bytes, ending in a hash of the whole key, so two long keys
        stay two."""
        if self.why_unstorable(key) is None:
            return key
        storable = UNSTORABLE_TEXT.sub("\ufffd", key)
        limit = self.key_bytes_max
        if limit is None or len(encoded := storable.encode("utf-8")) <= limit:
            return storable
        tail = "...sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return encoded[:limit - len(tail)].decode("utf-8", "ignore") + tail  # "ignore": a character cut in two

    def write_gate(self) -> AbstractContextManager[Any]:
        """Held around each write transaction of this process: nothing where the server queues writers itself."""
        return nullcontext()

    def safe_url(self) -> str:
        return redact_url(self.url)

    def engine_options(self) -> dict[str, Any]:
        return {}

    def bad_time(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """The column holds something that is not a finite time (NULL is fine)."""
        raise NotImplementedError

    def not_text(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """The column holds something other than text (NULL is fine)."""
        raise NotImplementedError

    def snapshot_bounds(self, conn: Connection) -> tuple[int | None, int | None]:
        """``(xmin, xmax)`` of the current snapshot where transactions can commit out of id order."""
        return None, None

    @contextmanager
    def read_only(self, conn: Connection) -> Iterator[None]:
        """A transaction in which the database refuses writes."""
        raise NotImplementedError
        yield  # pragma: no cover

    def configure(self, engine: Engine) -> None:
        """Install connect/begin hooks on a fresh engine."""

    def forget_connections_after_fork(self, engine: Engine) -> None:
        """In a forked child: the pool lets its parent's connections go without closing them (SQLAlchemy's
        recipe for a fork), so the child opens its own and the parent's sessions go on."""
        engine.dispose(close=False)

    def now(self) -> ColumnElement[Any]:
        """The database clock."""
        raise NotImplementedError

    def now_plus(self, seconds: Any) -> ColumnElement[Any]:
        """The database clock plus ``seconds`` (a number or a bound expression)."""
        raise NotImplementedError

    def seconds_between(self, start: Any, end: Any) -> ColumnElement[Any]:
        """``end - start`` in seconds, as a number; NULL when either is not a finite time."""
        raise NotImplementedError

    def json_text(self, column: ColumnElement[Any], key: str) -> ColumnElement[Any]:
        """A top-level key of a JSON column as text (NULL when absent or when the JSON does not parse)."""
        raise NotImplementedError

    def is_transient(self, exc: BaseException) -> bool:
        """Whether a driver error can succeed if retried."""
        raise NotImplementedError

    def migration_lock(self, conn: Connection) -> None:
        """Serialize concurrent migrators for the rest of the transaction."""

    def commit_without_flush(self) -> ColumnElement[Any]:
        """A column that, selected in a transaction, makes its commit return before the database's log is
        flushed to disk: a client killed after it loses nothing, a crash of the database server itself may
        lose it (the call journal's writes, where that costs one more paid call, not a wrong answer).
        Selected with the fence, it costs no round trip of its own."""
        return literal(None)

    def insert(self, table: Table) -> Any:
        """An INSERT with ``on_conflict_do_nothing``/``on_conflict_do_update``."""
        raise NotImplementedError

    def insert_many(self, conn: Connection, table: Table, rows: list[dict[str, Any]], *, stamped: str) -> None:
        """In ``conn``'s transaction: insert ``rows`` (dicts with the same keys) into ``table``, the column
        ``stamped`` set to the database clock."""
        for start in range(0, len(rows), INSERT_CHUNK):
            conn.execute(insert(table).values({stamped: self.now()}), rows[start:start + INSERT_CHUNK])

    def roll_up_finished(self, conn: Connection, lo: int, hi: int) -> None:
        """In ``conn``'s transaction: add the finished pipelines with ids ``lo``..``hi`` to the roll-ups of
        finished work (migration 0017). A pipeline that finishes is rolled up by a trigger; this is for
        pipelines written finished, in bulk (an import, the history bench)."""
        raise NotImplementedError

    @contextmanager
    def bounded(self, conn: Connection, seconds: float) -> Iterator[None]:
        """Inside ``conn``'s transaction: no statement, and no wait for a lock, lasts longer than ``seconds``
        (a failure the caller sees at once, instead of a wait as long as the store's statement timeout)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def prune_pause(self, batch_seconds: float) -> float:
        """Seconds a retention prune rests after a batch that took ``batch_seconds``, so live writers get in."""
        return 0.0

    def statement_clock(self) -> ColumnElement[Any]:
        """The database clock when this statement runs (not when its transaction began: a lock may have
        been waited for)."""
        return self.now()

    def missing_database_file(self) -> str | None:
        """The file the URL names when connecting would create it instead of opening it, else None."""
        return None

    def table_bytes(self, conn: Connection, table: str) -> int:
        """A table's bytes on disk (with its indexes and out-of-line values)."""
        raise NotImplementedError

    # -- column encodings (class-level: SQLAlchemy's column types see only its own dialect) ---------

    @classmethod
    def time_type(cls) -> TypeEngine[Any]:
        return DateTime(timezone=True)

    @classmethod
    def bind_time(cls, value: Any) -> Any:
        return value

    @classmethod
    def load_time(cls, value: Any) -> Any:
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value

    @classmethod
    def json_type(cls) -> TypeEngine[Any]:
        return Text()

    @classmethod
    def bind_json(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, JsonText):
            return str(value)  # encoded already
        return storable_json(value, default=str)

    @classmethod
    def load_json(cls, value: Any) -> Any:
        return load_json(value)

    @staticmethod
    def for_url(url: str | URL, **timeouts: float | None) -> Dialect:
        try:
            parsed = make_url(url) if isinstance(url, str) else url
            if parsed.port is not None and not 0 < parsed.port < 65536:  # not a number fails here too
                raise ValueError(f"port {parsed.port} is not from 1 to 65535")
        except Exception as exc:  # noqa: BLE001 - ArgumentError, ValueError (bad port), TypeError
            # The URL may hold a password even when it does not parse: show only its redacted form.
            raise ConfigurationError(f"not a database URL: {redact_url(str(url))} ({redact(exc)})") from None
        backend = parsed.get_backend_name()
        if backend == "postgresql":
            if parsed.drivername in ("postgresql", "postgresql+psycopg2"):
                # psycopg 3 is the one driver installed; a psycopg2 URL (what dagster-postgres takes) means the same
                parsed = parsed.set(drivername="postgresql+psycopg")
            elif parsed.drivername != "postgresql+psycopg":
                raise ConfigurationError(f"unsupported PostgreSQL driver {parsed.drivername!r} in "
                                         f"{redact_url(parsed)}: use postgresql:// (psycopg 3)")
            _check_host(parsed)
            return PostgresDialect(parsed, **timeouts)
        if backend == "sqlite":
            return SqliteDialect(parsed, **timeouts)
        raise ConfigurationError(f"unsupported database {backend!r} in {redact_url(parsed)}: use postgresql:// or sqlite:///")


def _refuse_text_not_utf8(dbapi_conn: Any) -> None:
    """Refuse a database whose text is not UTF-8 (LATIN1, SQL_ASCII), on connecting: the server told the client
    its encoding as the session began, so this costs no round trip. Such a database takes the usual ASCII keys,
    and then fails a checkpoint whose key or error holds a character it has no code for, after the work was
    paid for; and :meth:`Dialect.why_unstorable` holds for UTF-8 text only."""
    encoding = dbapi_conn.info.parameter_status("server_encoding")
    if encoding is not None and encoding != "UTF8":
        name = dbapi_conn.info.dbname
        dbapi_conn.close()  # the pool never got it: closed now, not when collected
        raise ConfigurationError(
            f"database {name!r} stores text as {encoding}, and recovery-ext needs UTF-8 "
            f"(item keys, results and errors may hold any character): use a database made with "
            f"CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0")


class PostgresDialect(Dialect):
    name = "postgresql"
    migrations_folder = "postgres"
    dml_in_cte = True
    node_functions = True
    journal_functions = True
    autocommit_reads = True
    row_locks = True
    key_bytes_max = 2500  # leaves the pipeline's id, the node's name (up to 150 bytes) and the entry's headers

    def engine_options(self) -> dict[str, Any]:
        """Connect and statement timeouts, unless the URL sets its own.

        ``statement_timeout`` also bounds lock waits (SQLSTATE 57014, retried by the store);
        ``idle_in_transaction_session_timeout`` ends the session of a worker frozen (SIGSTOP)
        inside a transaction, so its row locks never block a reclaim for longer than that.
        """
        query = self.url.query
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in query:
            connect_args["connect_timeout"] = max(1, math.ceil(self.connect_timeout))
        if "options" not in query:
            ms = int(self.statement_timeout * 1000)
            idle_ms = int(max(60.0, 2 * self.statement_timeout) * 1000)
            connect_args["options"] = f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={idle_ms}"
        if "keepalives" not in query:
            connect_args.update(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)
        # No pre-ping: it costs a round trip per checkout on the hot path. A connection that
        # died (server restart, pg_terminate_backend) fails its first statement instead, the
        # pool invalidates it and the store's retry runs the whole transaction again.
        # A small pool: a run worker needs one connection for its work and one for the heartbeat
        # thread; the overflow covers bursts (sensors, parallel threads) and is closed when idle.
        # json/jsonb decode through load_json: a value Python cannot decode (nested thousands deep) is a
        # CorruptJson of its row, not an error of the whole query. They encode in the form SQLite stores too
        # (storable_json): jsonb refuses a NUL, a lone surrogate and NaN, which json.loads accepts in an answer.
        return {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW, "pool_recycle": 1800,
                "connect_args": connect_args, "json_deserializer": load_json,
                "json_serializer": storable_json}

    @contextmanager
    def read_only(self, conn: Connection) -> Iterator[None]:
        with conn.begin():
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            yield

    def bad_time(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return and_(column.isnot(None), ~func.isfinite(column))

    def not_text(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return false()  # a text column holds text

    def configure(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            _refuse_text_not_utf8(dbapi_conn)
            # 'infinity'/'-infinity' (or any value beyond Python's range) must not break every
            # query that touches the row: they load as datetime.max/min, and the scan fails them.
            dbapi_conn.adapters.register_loader("timestamptz", _clamped_timestamptz_loader())

    def snapshot_bounds(self, conn: Connection) -> tuple[int | None, int | None]:
        row = conn.exec_driver_sql(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
            "pg_snapshot_xmax(pg_current_snapshot())::text::bigint").one()
        return int(row[0]), int(row[1])

    def now(self) -> ColumnElement[Any]:
        return func.now()

    def now_plus(self, seconds: Any) -> ColumnElement[Any]:
        if not isinstance(seconds, ColumnElement):
            seconds = bindparam(None, float(seconds), type_=Float)
        return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)

    def seconds_between(self, start: Any, end: Any) -> ColumnElement[Any]:
        # 'infinity' - now() raises "cannot subtract infinite timestamps": such a row has no duration
        return case((and_(func.isfinite(start), func.isfinite(end)), func.extract("epoch", end - start)), else_=None)

    def json_text(self, column: ColumnElement[Any], key: str) -> ColumnElement[Any]:
        value: ColumnElement[Any] = column.op("->>")(literal(key, type_=Text))
        return value

    def is_transient(self, exc: BaseException) -> bool:
        code = sqlstate(exc)
        if code is None:
            # libpq's connect failures carry no SQLSTATE: refused, unreachable, ConnectionTimeout
            # (nothing answered in time), but also a missing database or a wrong password. The
            # shared classifier tells them apart (the last two are not worth a retry).
            import psycopg

            orig = getattr(exc, "orig", None) or exc
            return isinstance(orig, psycopg.OperationalError) and is_retryable(orig)
        return code in _PG_TRANSIENT_CODES or code[:2] in _PG_TRANSIENT_CLASSES

    def commit_without_flush(self) -> ColumnElement[Any]:
        return func.set_config("synchronous_commit", "off", True)

    def migration_lock(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(7238461001)"))

    def insert(self, table: Table) -> Any:
        from sqlalchemy.dialects.postgresql import insert

        return insert(table)

    def insert_many(self, conn: Connection, table: Table, rows: list[dict[str, Any]], *, stamped: str) -> None:
        if len(rows) <= 1:
            super().insert_many(conn, table, rows, stamped=stamped)
            return
        # Many rows (a mass reclaim's transitions and events): one statement with one JSON parameter, not
        # one bound row each, which cost seconds per 10,000 rows in the driver and on the server.
        from sqlalchemy.dialects import postgresql

        names = list(rows[0])
        pg = postgresql.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves its __init__ unannotated
        types = ", ".join(f"{n} {table.c[n].type.compile(dialect=pg)}" for n in names)
        conn.execute(text(f"INSERT INTO {table.name} ({', '.join(names)}, {stamped}) SELECT {', '.join(names)}, now() "
                          f"FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r({types})"),
                     {"rows": storable_json(rows, default=str)})

    def roll_up_finished(self, conn: Connection, lo: int, hi: int) -> None:
        conn.execute(text("SELECT rx_roll_up_finished(:lo, :hi)"), {"lo": lo, "hi": hi})

    @contextmanager
    def bounded(self, conn: Connection, seconds: float) -> Iterator[None]:
        ms = max(1, int(seconds * 1000))
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {ms}")
        yield

    def statement_clock(self) -> ColumnElement[Any]:
        return func.clock_timestamp()

    def table_bytes(self, conn: Connection, table: str) -> int:
        return int(conn.scalar(text("SELECT pg_total_relation_size(:t)"), {"t": table}) or 0)

    @classmethod
    def json_type(cls) -> TypeEngine[Any]:
        return JSONB()

    @classmethod
    def bind_json(cls, value: Any) -> Any:
        return value

    @classmethod
    def load_json(cls, value: Any) -> Any:
        return value  # the driver decoded it with load_json


class _WriteLocks:
    """A lock per SQLite database file, shared by every store of this process that opens it."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def for_file(self, database: str) -> threading.RLock:
        key = database if database in ("", ":memory:") else os.path.realpath(database)
        with self._guard:
            return self._locks.setdefault(key, threading.RLock())  # a nested write of one thread waits on SQLite


_sqlite_write_locks = _WriteLocks()


# The database clock as epoch seconds, in SQLite's SQL: what now() compiles to, for the fixed statements of the
# hot paths (checkpoints, the ledger, the journal) that run on the driver's connection.
SQLITE_NOW = "(julianday('now') - 2440587.5) * 86400.0"


class SqliteDialect(Dialect):
    """SQLite: WAL, a busy timeout and foreign keys, set in one connect hook.

    Write transactions begin IMMEDIATE, so a claim's read and its update are one atomic
    step: SQLite's single writer lock plays the part of ``FOR UPDATE SKIP LOCKED``.
    """

    name = "sqlite"
    migrations_folder = "sqlite"
    prune_batch = 50  # a writer waits for the whole batch: keep it to tens of milliseconds
    ledger_rows_via_driver = True
    text_keeps_nul = True

    @property
    def busy_timeout_ms(self) -> int:
        """SQLite's lock wait: the statement timeout (what a writer waits for the single writer lock)."""
        return int(self.statement_timeout * 1000)

    def engine_options(self) -> dict[str, Any]:
        return {"connect_args": {"timeout": self.busy_timeout_ms / 1000, "check_same_thread": False}}

    def write_gate(self) -> AbstractContextManager[Any]:
        """One writer of this process at a time, waiting on a lock, not in SQLite's busy handler.

        SQLite has one write lock, and a writer that finds it taken sleeps in its busy handler (up to 100 ms
        at a time) before it tries again: 64 threads of one node writing at once (``ctx.map``) spent most of
        their time asleep with the lock free. Here they queue on a lock and each goes the moment the one
        before it commits; writers of other processes still meet in SQLite's own lock.
        """
        gate = self.__dict__.get("_write_gate")
        if gate is None:  # resolved once: realpath is a few system calls, and every write passes here
            gate = self.__dict__["_write_gate"] = _sqlite_write_locks.for_file(self.url.database or "")
        return gate

    @contextmanager
    def read_only(self, conn: Connection) -> Iterator[None]:
        raw: Any = conn.connection.driver_connection  # outside any transaction: pysqlite runs PRAGMAs as is
        raw.execute("PRAGMA query_only = ON")
        try:
            with conn.begin():
                yield
        finally:
            raw.execute("PRAGMA query_only = OFF")

    def configure(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy's begin hook, not pysqlite, decide when transactions start.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
            _enable_wal(cur)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = "IMMEDIATE" if conn.get_execution_options().get("rx_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")

    def prune_pause(self, batch_seconds: float) -> float:
        """One writer at a time, and a waiting writer's busy handler polls for the lock at most every 100 ms:
        a prune that began its next batch at once would starve it. Resting that long (and at least as long as
        the batch took) lets every waiting writer in between two batches."""
        return max(batch_seconds, 0.1)

    def now(self) -> ColumnElement[Any]:
        return literal_column(f"({SQLITE_NOW})", type_=Float)

    def bad_time(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        # epoch seconds: text, blobs and values beyond year 9999 are not times
        kind = func.typeof(column)
        return and_(column.isnot(None), or_(kind.not_in(("real", "integer")), column < 0, column > 253402300799))

    def not_text(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.typeof(column).not_in(("text", "null"))  # SQLite stores a blob or a number in any column

    def now_plus(self, seconds: Any) -> ColumnElement[Any]:
        if not isinstance(seconds, ColumnElement):
            seconds = bindparam(None, float(seconds), type_=Float)
        later: ColumnElement[Any] = self.now() + seconds
        return later

    def seconds_between(self, start: Any, end: Any) -> ColumnElement[Any]:
        # text in a time column would subtract as a number without error: no duration instead
        finite = and_(*[func.typeof(t).in_(("real", "integer")) for t in (start, end)])
        return case((finite, end - start), else_=None)

    def json_text(self, column: ColumnElement[Any], key: str) -> ColumnElement[Any]:
        # json_extract raises on text that does not parse; such a row reads as NULL instead.
        return case((func.json_valid(column) == 1, func.json_extract(column, f"$.{key}")), else_=None)

    def insert(self, table: Table) -> Any:
        from sqlalchemy.dialects.sqlite import insert

        return insert(table)

    def roll_up_finished(self, conn: Connection, lo: int, hi: int) -> None:
        conn.execute(text("INSERT INTO rx_roll_up_requests (lo, hi) VALUES (:lo, :hi)"), {"lo": lo, "hi": hi})

    @contextmanager
    def bounded(self, conn: Connection, seconds: float) -> Iterator[None]:
        # SQLite has no statement timeout: what a reader can wait for is a lock (the busy timeout), set for
        # this transaction on its connection and put back after it.
        raw: Any = conn.connection.driver_connection
        raw.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")
        try:
            yield
        finally:
            raw.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")

    def forget_connections_after_fork(self, engine: Engine) -> None:
        """An in-memory database lives in its connection: a forked child keeps its copy, the only one it can
        have. A database file is opened anew, as on any other database."""
        if (self.url.database or "") not in ("", ":memory:"):
            super().forget_connections_after_fork(engine)

    def missing_database_file(self) -> str | None:
        database = self.url.database or ""
        if database in ("", ":memory:") or database.startswith("file:") or self.url.query.get("uri"):
            return None
        return None if Path(database).is_file() else database

    def table_bytes(self, conn: Connection, table: str) -> int:
        return int(conn.scalar(text("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = :t"), {"t": table}) or 0)

    @classmethod
    def time_type(cls) -> TypeEngine[Any]:
        return Float()

    @classmethod
    def bind_time(cls, value: Any) -> Any:
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            return value.timestamp()
        return float(value)

    @classmethod
    def load_time(cls, value: Any) -> Any:
        try:
            return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
        except (TypeError, ValueError, OverflowError, OSError):
            # Text or an absurd number in a time column: readable, never a traceback; the scan fails the row.
            return dt.datetime.min.replace(tzinfo=dt.UTC)

    def is_transient(self, exc: BaseException) -> bool:
        orig = getattr(exc, "orig", exc)
        if not isinstance(orig, sqlite3.OperationalError):
            return False
        code = getattr(orig, "sqlite_errorcode", None)
        if code is not None:
            return code in _SQLITE_BUSY_CODES
        message = str(orig).lower()
        return "database is locked" in message or "database is busy" in message


# SQLAlchemy's dialect name -> ours, for the column types (any other, e.g. the default one str() compiles
# with, gets the base class's plain encodings).
_BY_SQLALCHEMY_NAME: dict[str, type[Dialect]] = {"postgresql": PostgresDialect, "sqlite": SqliteDialect}


def column_codec(dialect: SqlAlchemyDialect) -> type[Dialect]:
    """The :class:`Dialect` whose column encodings apply to a SQLAlchemy dialect."""
    return _BY_SQLALCHEMY_NAME.get(dialect.name, Dialect)


# The two column types of the tables (schema.py) whose encoding differs by database: each is its dialect's.
class DbTime(TypeDecorator[Any]):
    """An aware UTC timestamp; epoch seconds on SQLite so the database clock can compare it
    (each database's encoding is its :class:`Dialect`'s)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: SqlAlchemyDialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(column_codec(dialect).time_type())

    def process_bind_param(self, value: Any, dialect: SqlAlchemyDialect) -> Any:
        return None if value is None else column_codec(dialect).bind_time(value)

    def process_result_value(self, value: Any, dialect: SqlAlchemyDialect) -> Any:
        return None if value is None else column_codec(dialect).load_time(value)


class DbJson(TypeDecorator[Any]):
    """JSON; a value that does not parse comes back as :class:`CorruptJson` instead of raising."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: SqlAlchemyDialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(column_codec(dialect).json_type())

    def process_bind_param(self, value: Any, dialect: SqlAlchemyDialect) -> Any:
        return column_codec(dialect).bind_json(value)

    def process_result_value(self, value: Any, dialect: SqlAlchemyDialect) -> Any:
        return None if value is None else column_codec(dialect).load_json(value)


def _clamped_timestamptz_loader() -> type:
    import datetime as dt

    from psycopg.types.datetime import TimestamptzLoader

    class ClampedTimestamptzLoader(TimestamptzLoader):
        def load(self, data: Any) -> Any:
            raw = bytes(data)
            if raw == b"infinity":
                return dt.datetime.max.replace(tzinfo=dt.UTC)
            if raw == b"-infinity":
                return dt.datetime.min.replace(tzinfo=dt.UTC)
            try:
                return super().load(data)
            except Exception:  # noqa: BLE001 - out of Python's range (e.g. year 10000 or BC)
                early = raw.endswith(b"BC") or raw.startswith(b"-")
                return (dt.datetime.min if early else dt.datetime.max).replace(tzinfo=dt.UTC)

    return ClampedTimestamptzLoader


def _check_host(url: URL) -> None:
    """A host name DNS cannot take (a label over 63 characters, 253 in all) is a clear error, not a UnicodeError.
    A host holding ``@`` is a password holding one, not percent-encoded: the URL ends its password at the first
    ``@``, so the rest of it would reach the driver, and its error, as part of the host name."""
    if "@" in (url.host or ""):
        raise ConfigurationError(f"not a database URL: {redact_url(url)} (its password holds '@'; write it "
                                 "percent-encoded, as %40)")
    for host in (url.host or "").split(","):
        if not host or host.startswith("/") or ":" in host:  # none, a socket directory, an IPv6 address
            continue
        try:
            encoded = host.encode("idna")
        except UnicodeError:
            encoded = b""
        if not encoded or len(encoded) > 253:
            shown = host if len(host) <= 40 else f"{host[:40]}... ({len(host)} characters)"
            raise ConfigurationError(f"not a valid host name in the database URL: {redact(shown)}")


def _timeout(name: str, value: float | None, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.1 <= value <= 3600:
        raise ConfigurationError(f"{name} must be between 0.1 and 3600 seconds, got {value!r}")
    return float(value)


def _enable_wal(cur: Any, attempts: int = 200) -> None:
    """Switch to WAL once per database file; the switch itself ignores the busy timeout."""
    for _ in range(attempts):
        if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            return
        try:
            cur.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            time.sleep(0.01)
    cur.execute("PRAGMA journal_mode=WAL")


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg/psycopg2 error, or of the one a SQLAlchemy error wraps."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code is None:
        diag = getattr(orig, "diag", None)
        code = getattr(diag, "sqlstate", None)
    return code if isinstance(code, str) else None
