"""The engine, transactions, driver-error wrapping and the write helpers every store part shares.

Among them the fence (:class:`Fence`): every write for an owner starts with its check, in the writer's own
transaction, so a superseded worker's write changes nothing and raises :class:`~recovery_ext._errors.OwnershipLost`.
User code writes through :class:`~recovery_ext._store.models.FencedTransaction`, which the pipelines component
opens with the same check."""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Literal, TypeVar

import tenacity
from sqlalchemy import Connection, Table, create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from recovery_ext._store import migrations
from recovery_ext._store.dialects import Dialect
from recovery_ext._errors import (ConfigurationError, MigrationError, NotFound, OwnershipLost, StoreError,
                                  StoreUnavailable)
from recovery_ext._classify.redaction import redact
from recovery_ext._classify.retry import retry_if_retryable, wait_jittered_exponential
from recovery_ext._store.models import Ownership
from recovery_ext._store.schema import events, pipelines, transitions
from recovery_ext._store.statuses import PipelineStatus

log = logging.getLogger("recovery_ext._store.store")
# Each retried attempt of a store call: a warning a worker's log keeps, which a CLI command (one final line) quiets.
retry_log = logging.getLogger("recovery_ext._store.store.retries")

T = TypeVar("T")

# The default heartbeat timeout: a store call keeps retrying a transient error for as long
# as its pipeline could go without a heartbeat anyway (HeartbeatSettings.timeout).
DEFAULT_RETRY_BUDGET = 90.0
MAX_RETRY_BUDGET = 86400.0

# One retrying store call per thread at a time: a store method that calls another store
# method retries as a whole, so budgets never multiply.
_retry_state = threading.local()


def is_retry() -> bool:
    """Inside a retried store call, whether this is not the first attempt (its commit may have landed)."""
    return getattr(_retry_state, "attempt", 1) > 1


def retried(method: Callable[..., T]) -> Callable[..., T]:
    """Re-run a whole store call (one transaction) on transient errors, within ``self.retry_budget``.

    Transient is what the shared classifier says: lost connections, a restarting server,
    deadlocks and serialization failures (SQLSTATE 08/40001/40P01/53/57), SQLite busy.
    """

    @functools.wraps(method)
    def wrapper(self: Transactions, *args: Any, **kwargs: Any) -> T:
        if getattr(_retry_state, "active", False) or self.retry_budget <= 0:
            return method(self, *args, **kwargs)
        deadline = time.monotonic() + self.retry_budget
        _retry_state.active = True
        try:
            try:
                # The first attempt runs without tenacity: almost every call succeeds, and building
                # the Retrying costs ~20 us per call, a tenth of a hot-path checkpoint's client time.
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - tenacity's classifier judges it just below
                failed = [exc]
            # A first attempt that outlived the whole budget and then found its session gone was frozen (SIGSTOP,
            # a paused VM) or hung on a dead connection: it gets one try on a new session, which tells a
            # superseded owner so, instead of reporting the database unavailable without having asked it.
            first_error = failed[0]
            once_more = (time.monotonic() >= deadline and isinstance(first_error, StoreUnavailable)
                         and first_error.session_lost)
            for attempt in self._retrying(method.__name__, deadline=deadline, once_more=once_more):
                with attempt:
                    if failed:
                        raise failed.pop()  # attempt 1, already run: tenacity judges it, logs it and waits
                    _retry_state.attempt = attempt.retry_state.attempt_number
                    return method(self, *args, **kwargs)
            raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
        finally:
            _retry_state.active = False
            _retry_state.attempt = 1

    wrapper.__rx_retried__ = True  # type: ignore[attr-defined]
    return wrapper


def _stop_at(deadline: float) -> Callable[[tenacity.RetryCallState], bool]:
    return lambda _state: time.monotonic() >= deadline


def validate_retry_budget(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_RETRY_BUDGET:
        raise ConfigurationError(f"retry_budget must be between 0 and {MAX_RETRY_BUDGET:.0f} seconds, got {value!r}")
    return float(value)

# SQLite allows 32766 bound variables; PostgreSQL 65535. Chunks stay well below both.
CHUNK = 2000


def chunks(values: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Transactions:
    """The transactions and write helpers of one database: shared by the store and each of its components.

    A subclass sets ``dialect``, ``url``, ``engine`` and ``retry_budget``."""

    dialect: Dialect
    url: Any
    engine: Engine
    retry_budget: float
    kept: KeptConnection  # the hot path's connection between its statements (driver_autocommit)

    def _retrying(self, what: str, *, deadline: float | None = None, once_more: bool = False) -> tenacity.Retrying:
        """Tenacity's loop for a store call; ``deadline`` (monotonic) when the call started earlier
        (its first attempt ran already), else the budget counts from now; ``once_more``: one more attempt
        whatever the deadline (the first ran past it, then lost its session)."""
        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            retry_log.warning("store call %s failed (attempt %d), retrying in %.1f s: %s", what, state.attempt_number,
                        state.upcoming_sleep, redact(exc))

        stop: Callable[[tenacity.RetryCallState], bool]
        if once_more:
            stop = tenacity.stop_after_attempt(2)
        elif deadline is not None:
            stop = _stop_at(deadline)
        elif getattr(_retry_state, "active", False):  # the enclosing retried call retries as a whole
            stop = tenacity.stop_after_attempt(1)
        else:
            stop = tenacity.stop_after_delay(self.retry_budget)
        return tenacity.Retrying(
            stop=stop, retry=retry_if_retryable(),
            wait=wait_jittered_exponential(0.2, max_delay=3.0, jitter=0.5), before_sleep=before_sleep, reraise=True,
        )


    # -- transactions ---------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite); commits on success."""
        with self.dialect.write_gate(), self._wrap_errors(), \
                self.engine.connect().execution_options(rx_write=True) as conn, conn.begin():
            yield conn

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """Each statement its own transaction, with no BEGIN/COMMIT round trips: for hot-path
        writes that are one statement (several writes joined as data-modifying CTEs)."""
        with self._wrap_errors(), self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn

    def driver_autocommit(self) -> AbstractContextManager[Any]:
        """A pooled connection's own driver connection (psycopg) in autocommit mode, for a hot-path
        statement the caller runs as fixed SQL text.

        It skips what SQLAlchemy's execute costs per call (compiled-cache lookup, parameter
        processing, the isolation level set at checkout and reset at return), which is most of a
        one-statement checkpoint's client time on a busy machine, and the pool's checkout too when
        the database's kept connection is free (see :class:`KeptConnection`). Driver errors are
        wrapped as everywhere else, and a connection the server dropped is invalidated, so the
        store's retry runs the call again on a new one.
        """
        return _DriverAutocommit(self)

    @contextmanager
    def driver_of(self, conn: Connection) -> Iterator[Any]:
        """The psycopg connection under ``conn``, inside ``conn``'s open transaction, for a hot-path
        statement run as fixed SQL text; driver errors are wrapped as everywhere else (the caller may
        catch a driver error it expects first) and a connection the server dropped is invalidated."""
        raw = conn.connection.driver_connection
        try:
            yield raw
        except self.engine.dialect.loaded_dbapi.Error as exc:
            invalidated = self.engine.dialect.is_disconnect(exc, raw, None)
            if invalidated:
                conn.invalidate(exc)
            raise self.wrap_driver_error(exc, invalidated=invalidated) from exc

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._wrap_errors(), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def read_statement(self) -> Iterator[Connection]:
        """For a read that is ONE statement: no BEGIN/COMMIT round trips on PostgreSQL, where a
        statement is its own snapshot anyway (READ COMMITTED); a read transaction on SQLite."""
        if not self.dialect.autocommit_reads:
            with self.read() as conn:
                yield conn
            return
        with self.autocommit() as conn:
            yield conn

    @contextmanager
    def read_only(self) -> Iterator[Connection]:
        """A transaction the database itself refuses to write in (what op code gets for reads).

        Opening it is retried on transient errors (there is no pool pre-ping: a connection the
        server dropped fails here and is replaced); the caller's statements are not.
        """
        for attempt in self._retrying("read-only transaction"):
            with attempt:
                stack = ExitStack()
                try:
                    stack.enter_context(self._wrap_errors())
                    conn = stack.enter_context(self.engine.connect())
                    stack.enter_context(self.dialect.read_only(conn))
                except BaseException as exc:
                    if not stack.__exit__(type(exc), exc, exc.__traceback__):
                        raise
        with stack:
            yield conn

    @contextmanager
    def _wrap_errors(self) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise self._wrapped_sqlalchemy_error(exc) from exc

    def _wrapped_sqlalchemy_error(self, exc: SQLAlchemyError) -> StoreError:
        """The store's error for an error SQLAlchemy raised (a driver error it wrapped, or its own)."""
        if isinstance(exc, DBAPIError):
            return self.wrap_error(exc)
        return StoreError(f"database error: {redact(str(exc))}")

    def wrap_error(self, exc: DBAPIError) -> StoreError:
        return self.wrap_driver_error(getattr(exc, "orig", None) or exc, invalidated=exc.connection_invalidated)

    def wrap_driver_error(self, exc: BaseException, *, invalidated: bool = False) -> StoreError:
        """The store's error for a driver error: StoreUnavailable (retried) when a retry can fix it."""
        # libpq puts the reason of a failed connection on its second line ("...failed:\nFATAL: ...")
        message = " ".join(" ".join(redact(str(exc) or type(exc).__name__).split()).split("\n"))[:500]
        if invalidated or self.dialect.is_transient(exc):
            return StoreUnavailable(f"database unavailable: {message}", session_lost=invalidated)
        return StoreError(f"database error: {message}")


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
        self.dialect.insert_many(conn, transitions, [_without_at(r) for r in batch], stamped="at")

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
        self.dialect.insert_many(conn, events, batch, stamped="created_at")

    def upsert(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], *, keys: Sequence[str]) -> None:
        """Insert or update by primary key, so re-running a node writes the same rows again."""
        for row in rows:
            stmt = self.dialect.insert(table).values(**row, updated_at=self.dialect.now())
            update_cols = {c: stmt.excluded[c] for c in row if c not in keys}
            update_cols["updated_at"] = self.dialect.now()
            conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=update_cols))

    @retried
    def record_event(self, kind: str, payload: dict[str, Any] | None = None, *, pipeline_id: int | None = None) -> None:
        with self.write() as conn:
            self.record_events(conn, [{"kind": kind, "payload": payload, "pipeline_id": pipeline_id}])



class Database(Transactions):
    """Owns the engine; every store operation runs in one of its transactions."""

    def __init__(self, url: str, *, echo: bool = False, engine: Engine | None = None,
                 retry_budget: float = DEFAULT_RETRY_BUDGET, connect_timeout: float | None = None,
                 statement_timeout: float | None = None) -> None:
        self.dialect = Dialect.for_url(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        self.url = self.dialect.url
        self.retry_budget = validate_retry_budget(retry_budget)
        if engine is None:
            try:
                engine = create_engine(self.url, echo=echo, **self.dialect.engine_options())
            except (ImportError, SQLAlchemyError, ValueError, TypeError) as exc:
                # e.g. postgresql+nodriver://: never echo the URL, it may carry a password.
                raise ConfigurationError(
                    f"cannot use database URL {self.dialect.safe_url()}: {redact(exc)}") from None
            self.dialect.configure(engine)
        self.engine = engine
        self.kept = KeptConnection()
        # Asked of the pool's own listeners, not event.contains: SQLAlchemy's registry keys a target by its id(), so
        # a dropped pool's entry can outlive it and answer for a new pool at the same address (the listener was
        # then missing, about one store in 200 given the caller's fresh engine).
        if _out_of_autocommit not in engine.pool.dispatch.checkin:
            event.listen(engine.pool, "checkin", _out_of_autocommit)
        _live_databases.add(self)


    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dialect.safe_url()!r})"

    def close(self) -> None:
        self.kept.release(for_good=True)
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


    # -- schema ---------------------------------------------------------------------------

    def migrate(self, package: str = migrations.LIBRARY) -> list[migrations.Migration]:
        """Apply the library's pending migrations, or those of an application ``package`` (after the library's)."""
        if package != migrations.LIBRARY:
            try:
                migrations.check_package(package)
            except ConfigurationError as exc:
                raise MigrationError(str(exc)) from None
        with self._wrap_errors():
            if package != migrations.LIBRARY:
                migrations.apply_migrations(self.engine, self.dialect)
            return migrations.apply_migrations(self.engine, self.dialect, package)

    @retried
    def check_schema(self) -> None:
        """Raise MigrationError when a newer release migrated this database (its tables are not this code's)."""
        with self._wrap_errors():
            migrations.check_not_newer(self.engine, self.dialect)

    def pending_migrations(self, package: str = migrations.LIBRARY) -> list[migrations.Migration]:
        with self._wrap_errors():
            return migrations.pending_migrations(self.engine, self.dialect, package)



def _without_at(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "at"}



def shared_retry_budget() -> Any:
    """A ``retry_budget`` attribute that reads and sets that of ``self._db``: the store and each of its components
    have one budget, their Database's."""
    def get(self: Any) -> float:
        return float(self._db.retry_budget)

    def set_(self: Any, value: float) -> None:
        self._db.retry_budget = value

    return property(get, set_)


class Component(Transactions):
    """One part of the store: it runs its transactions on the store's one :class:`Database` (its engine,
    dialect and retry budget), so every component shares the pool and the budget, and none owns them."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.dialect = db.dialect
        self.url = db.url
        self.engine = db.engine
        self.kept = db.kept

    retry_budget = shared_retry_budget()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dialect.safe_url()!r})"


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


class KeptConnection:
    """One pooled connection a database keeps checked out, in autocommit mode, between its hot-path statements.

    A checkout from SQLAlchemy's pool and its return, with autocommit switched on and off, cost about 25 us of
    client CPU per statement: an eighth of a one-item checkpoint on PostgreSQL (bench.checkpoint_floor, the
    ``checkout`` row). A loop of items runs its statements one after another, so one connection kept between
    them saves that; statements that overlap it (other threads) check out of the pool as before. It is the
    pool's own connection, so the pool's limits count it. It goes back to the pool once it has been kept
    ``RETURN_AFTER`` seconds (the pool recycles it as it does the others: looked at when it is kept and when it
    is taken), when its statement failed on the driver (the usual path invalidates or returns it), and when the
    database closes. However it goes back (even garbage-collected), the pool's checkin switches autocommit off
    (:func:`_out_of_autocommit`). A forked child never uses it (see :func:`_after_fork_in_child`).

    Hand-written, not a second SQLAlchemy pool: an AUTOCOMMIT engine's checkout alone still costs 15 us of the
    25 (measured with the statement), and a second pool would double the connections a process may open.
    """

    RETURN_AFTER = 300.0

    __slots__ = ("_closed", "_kept", "_lock")

    def __init__(self) -> None:
        self._kept: tuple[PoolProxiedConnection, float] | None = None  # the connection, when first checked out
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> tuple[PoolProxiedConnection, float] | None:
        """The kept connection and when it was first checked out, now this caller's alone; None when another
        statement has it, none is kept yet, or the one kept was old enough to go back to the pool (it goes)."""
        with self._lock:  # an uncontended lock: a hand-over never races, on a free-threaded build too
            kept, self._kept = self._kept, None
        if kept is not None and time.monotonic() - kept[1] >= self.RETURN_AFTER:
            _give_back(kept[0])
            return None
        return kept

    def keep(self, pooled: PoolProxiedConnection, since: float) -> bool:
        """Keep ``pooled`` (in autocommit mode, no transaction open) for the next statement; False when one is
        kept already, it was kept long enough, or the database closed: the caller returns it to the pool."""
        with self._lock:
            if self._kept is not None or self._closed or time.monotonic() - since >= self.RETURN_AFTER:
                return False
            self._kept = (pooled, since)
            return True

    def release(self, *, for_good: bool = False) -> None:
        """Return the kept connection to the pool now, out of autocommit mode (the next statement checks one out
        and keeps it again); ``for_good``: the database closes, none is kept after this."""
        with self._lock:
            self._closed = self._closed or for_good
            kept, self._kept = self._kept, None
        if kept is not None:
            _give_back(kept[0])

    def forget(self) -> None:
        """In a forked child: never hand out the parent's connection, nor close it (see _after_fork_in_child);
        the lock is made anew, as another thread may have held it when the process forked."""
        self._lock = threading.Lock()
        if self._kept is not None:
            _parents_connections.append(self._kept)
        self._kept = None


_IDLE = 0  # libpq's PQTRANS_IDLE (psycopg's TransactionStatus.IDLE): the session has no transaction open
_live_databases: weakref.WeakSet[Database] = weakref.WeakSet()
_parents_connections: list[Any] = []


def _after_fork_in_child() -> None:
    """A forked child opens connections of its own: its parent's sessions go on in the parent, so the child
    neither uses them nor closes them (closing one would end the parent's session on the server). The kept
    connection is held here for good, unused; the pool forgets its connections (the dialect's
    ``forget_connections_after_fork``). One database that fails it does not stop the others."""
    failed: list[BaseException] = []
    for db in list(_live_databases):
        try:
            db.kept.forget()
            db.dialect.forget_connections_after_fork(db.engine)
        except Exception as exc:  # noqa: BLE001 - raised below, after every database had its turn
            failed.append(exc)
    if failed:
        raise failed[0]  # Python reports an at-fork hook's error and goes on


def _out_of_autocommit(dbapi_conn: Any, _record: Any) -> None:
    """The pool's checkin: a connection the hot path used goes back out of autocommit mode, however it came back
    (given back, or garbage-collected with its holder), so a transaction on it is one (sqlite3's connections
    have no ``autocommit`` of True: nothing to do there)."""
    if dbapi_conn is not None and getattr(dbapi_conn, "autocommit", None) is True and not dbapi_conn.closed:
        dbapi_conn.autocommit = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _give_back(pooled: PoolProxiedConnection) -> None:
    """Return a driver_autocommit connection to the pool, out of autocommit mode (the pool's others are not)."""
    try:
        raw = pooled.driver_connection
        if raw is not None and not raw.closed:  # a dead connection refuses the switch; the pool replaces it
            raw.autocommit = False
    except Exception:  # noqa: BLE001 - it failed the switch: closed and replaced, not pooled as it is
        pooled.invalidate()
    finally:
        pooled.close()


class _DriverAutocommit:
    """:meth:`Transactions.driver_autocommit`'s context manager, a plain class: it runs once per hot-path
    statement, and a generator-based one (with a nested one for the checkout) cost about a tenth of a
    one-item checkpoint's client CPU."""

    __slots__ = ("db", "pooled", "raw", "since")
    pooled: PoolProxiedConnection
    raw: Any  # the driver's connection (psycopg's)
    since: float

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def __enter__(self) -> Any:
        db = self.db
        kept = db.kept.take()
        if kept is not None:
            self.pooled, self.since = kept
            self.raw = raw = self.pooled.driver_connection  # kept only while it had one
            return raw
        try:
            pooled = db.engine.raw_connection()
        except SQLAlchemyError as exc:
            raise db._wrapped_sqlalchemy_error(exc) from exc
        except db.engine.dialect.loaded_dbapi.Error as exc:  # the pool's connect raises the driver's own error
            raise db.wrap_driver_error(exc) from exc
        raw = pooled.driver_connection
        assert raw is not None, "a connection just checked out of the pool has its driver connection"
        self.pooled, self.raw, self.since = pooled, raw, time.monotonic()
        try:
            raw.autocommit = True
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        return raw

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        db, pooled, raw = self.db, self.pooled, self.raw
        error = db.engine.dialect.loaded_dbapi.Error
        if not isinstance(exc, error) and not raw.closed and raw.autocommit is True \
                and raw.info.transaction_status == _IDLE and db.kept.keep(pooled, self.since):
            return False  # the body's own error (or none): the session is sound, kept for the next statement
        try:
            if not raw.closed:  # a dead connection refuses the switch; it is invalidated below
                raw.autocommit = False
        except error as switch_failed:
            if exc is not None and not isinstance(exc, error):
                # the body stopped mid-statement (a signal's exception, such as Dagster's interrupt): the
                # session's state is unknown, so its connection is dropped, and the body's exception goes on
                # as it was raised, not as the store's error
                pooled.invalidate(switch_failed)
                pooled.close()
                return False
            exc = exc if isinstance(exc, error) else switch_failed
        try:
            if isinstance(exc, error):
                invalidated = db.engine.dialect.is_disconnect(exc, raw, None)
                if invalidated:
                    pooled.invalidate(exc)
                raise db.wrap_driver_error(exc, invalidated=invalidated) from exc
        finally:
            pooled.close()
        return False
