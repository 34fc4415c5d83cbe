"""The hot path's driver connection (``driver_autocommit``) on a real PostgreSQL.

The database keeps one connection in autocommit mode between hot-path statements (``KeptConnection``): a sound
session is handed to the next statement as it is; a statement that overlaps it gets one of the pool's, which
goes back to the pool out of autocommit mode; a session the server ended is invalidated; a driver error
reaches the caller as the store's own error; a forked child never uses its parent's kept session.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import weakref

import psycopg
import pytest
from sqlalchemy import create_engine, event

from recovery_ext._errors import StoreError, StoreUnavailable
from recovery_ext._store.database import KeptConnection, _out_of_autocommit
from recovery_ext._store.hot_path import statement_cursor
from recovery_ext._store.store import RecoveryStore
from recovery_pipelines.devserver import wait_for


@pytest.fixture
def store(pg_url):
    store = RecoveryStore(pg_url, retry_budget=0)
    store.migrate()
    yield store
    store.close()


def _admin(pg_url: str) -> psycopg.Connection:
    return psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def test_a_statement_commits_at_once_and_its_connection_is_kept_for_the_next_one(store):
    with store._db.driver_autocommit() as raw:
        assert raw.autocommit is True
        raw.execute("CREATE TABLE rx_autocommit_probe (id int)")  # committed at once: no transaction is open
        assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert raw.autocommit is True and not raw.closed  # kept as it is, not switched back for the pool
    with store._db.driver_autocommit() as again:
        assert again is raw
    with store._db.read() as conn:  # the pool's connection: another session, transactional, and it sees the table
        pooled = conn.connection.driver_connection
        assert pooled is not raw and pooled.autocommit is False
        assert conn.exec_driver_sql("SELECT count(*) FROM rx_autocommit_probe").scalar() == 0


def test_an_error_of_the_body_propagates_as_it_is_and_the_sound_session_is_kept(store):
    with pytest.raises(KeyError, match="mine"), store._db.driver_autocommit() as raw:
        raise KeyError("mine")
    with store._db.driver_autocommit() as again:
        assert again is raw and again.execute("SELECT 1").fetchone() == (1,)


def test_a_driver_error_is_the_stores_error_and_the_connection_goes_back_to_the_pool(store):
    with pytest.raises(StoreError, match="syntax error") as caught, store._db.driver_autocommit() as raw:
        raw.execute("SELEKT 1")
    assert not isinstance(caught.value, StoreUnavailable)  # a bad statement is not retried
    assert isinstance(caught.value.__cause__, psycopg.errors.SyntaxError)
    assert raw.autocommit is False and not raw.closed  # the usual path: out of autocommit, into the pool
    with store._db.driver_autocommit() as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_a_session_the_server_ended_is_unavailable_and_its_connection_is_neither_kept_nor_pooled(store, pg_url):
    with store._db.driver_autocommit() as raw:  # now kept
        raw.execute("SELECT 1")
    with pytest.raises(StoreUnavailable) as caught, store._db.driver_autocommit() as same:
        assert same is raw
        with _admin(pg_url) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (raw.info.backend_pid,))
        raw.execute("SELECT 1")
    assert caught.value.session_lost is True
    assert raw.closed  # invalidated: the next statement gets a new session
    with store._db.driver_autocommit() as fresh:
        assert fresh is not raw and fresh.execute("SELECT 1").fetchone() == (1,)


def test_a_statement_overlapping_the_kept_one_gets_a_pooled_connection_and_one_is_kept_after(store):
    with store._db.driver_autocommit() as first:
        with store._db.driver_autocommit() as second:  # another thread's statement, at the same time
            assert second is not first and second.autocommit is True
            assert second.info.backend_pid != first.info.backend_pid
        assert second.autocommit is True  # the first to end is kept
    assert first.autocommit is False and not first.closed  # one is kept: the other went back to the pool
    with store._db.driver_autocommit() as third:
        assert third is second


def test_a_connection_kept_long_enough_goes_back_to_the_pool(store, monkeypatch):
    monkeypatch.setattr(KeptConnection, "RETURN_AFTER", 0.0)
    with store._db.driver_autocommit() as raw:
        raw.execute("SELECT 1")
    assert raw.autocommit is False and not raw.closed  # returned, transactional, for the pool to recycle


def _backend_alive(pg_url: str, pid: int) -> bool:
    with _admin(pg_url) as admin:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (1,)


def test_closing_the_store_closes_the_kept_connection(pg_url):
    store = RecoveryStore(pg_url, retry_budget=0)
    with store._db.driver_autocommit() as raw:
        raw.execute("SELECT 1")
    pid = raw.info.backend_pid
    store.close()
    assert raw.closed
    wait_for(lambda: not _backend_alive(pg_url, pid), timeout=10, what="the kept session's backend to end")


def test_a_kept_connection_whose_store_is_dropped_unclosed_reaches_the_pool_out_of_autocommit(pg_url):
    engine = create_engine(pg_url)  # the caller's engine: the store does not dispose of it
    try:
        store = RecoveryStore(pg_url, engine=engine, retry_budget=0)
        with store._db.driver_autocommit() as raw:
            raw.execute("SELECT 1")
        del store
        gc.collect()  # the kept connection's holder is gone: SQLAlchemy checks its connection in
        assert raw.closed or raw.autocommit is False
        with engine.connect() as conn, conn.begin():
            assert conn.connection.driver_connection.autocommit is False  # a transaction here is one
    finally:
        engine.dispose()


def test_a_fresh_engine_gets_the_checkin_switch_even_when_sqlalchemys_registry_answers_for_a_dropped_pool(
        pg_url, monkeypatch):
    """SQLAlchemy's event registry keys a target by its id(): a dropped pool's entry can outlive the pool and
    answer ``event.contains`` for a new pool at the same address (seen about once in 200 stores made on fresh
    engines: the dropped store's kept connection then reached the pool in autocommit mode). That stale answer is
    forced here, as address reuse cannot be: the store asks the pool's own listeners instead."""
    monkeypatch.setattr(event, "contains", lambda *_args: True)
    engine = create_engine(pg_url)
    try:
        RecoveryStore(pg_url, engine=engine, retry_budget=0)
        assert _out_of_autocommit in engine.pool.dispatch.checkin
        RecoveryStore(pg_url, engine=engine, retry_budget=0)  # a second store on the same engine adds none
        assert list(engine.pool.dispatch.checkin).count(_out_of_autocommit) == 1
    finally:
        engine.dispose()


def _forked(body) -> tuple[int, str]:
    """Run ``body()`` in a forked child; (its exit code, what it wrote). The child leaves without running the
    parent's cleanup (os._exit), after collecting its garbage: what the child drops must not end the parent's
    sessions. A child still running after 30 s is killed (a lock held at the fork would hang it)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, str(body()).encode())
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    ended: list[int] = []

    def child_ended() -> bool:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            ended.append(os.waitstatus_to_exitcode(status))
        return bool(ended)

    try:
        wait_for(child_ended, timeout=30, interval=0.05, what="the forked child to end")
    except BaseException:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        raise
    finally:
        with os.fdopen(read_end) as reader:
            written = reader.read()
    return ended[0], written


def test_a_forked_child_opens_its_own_sessions_and_leaves_the_parents_alone(store, pg_url):
    with store._db.driver_autocommit() as raw:  # the kept one
        kept_pid = raw.info.backend_pid
    with store._db.write() as one, store._db.write() as two:  # and two of the pool's, then idle in it
        pooled = {one.connection.driver_connection.info.backend_pid,
                  two.connection.driver_connection.info.backend_pid}
    parents = pooled | {kept_pid}
    assert len(parents) == 3

    def child_sessions() -> str:
        with store._db.driver_autocommit() as own, store._db.read() as conn:
            return f"{own.info.backend_pid} {conn.connection.driver_connection.info.backend_pid}"

    code, written = _forked(child_sessions)
    assert code == 0 and len(written.split()) == 2
    assert not {int(pid) for pid in written.split()} & parents  # sessions of its own
    assert all(_backend_alive(pg_url, pid) for pid in parents)  # and the parent's all go on
    with store._db.driver_autocommit() as again:
        assert again is raw and again.execute("SELECT pg_backend_pid()").fetchone() == (kept_pid,)


def test_a_forked_child_does_not_hang_on_a_lock_another_thread_held_at_the_fork(store):
    with store._db.driver_autocommit() as raw:
        raw.execute("SELECT 1")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._db.kept._lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)

        def statement() -> int:
            with store._db.driver_autocommit() as own:
                return int(own.execute("SELECT 1").fetchone()[0])

        code, written = _forked(statement)
    finally:
        release.set()
        holder.join(10)
    assert (code, written) == (0, "1")


def test_a_server_that_cannot_be_reached_is_unavailable():
    store = RecoveryStore("postgresql+psycopg://postgres@127.0.0.1:1/nothing_listens_here", retry_budget=0)
    try:
        with pytest.raises(StoreUnavailable, match="database unavailable"), store._db.driver_autocommit():
            pytest.fail("no connection, so the body never runs")
    finally:
        store.close()


def test_each_connection_keeps_one_statement_cursor_that_outlives_a_failed_statement_and_leaves_with_it(store, pg_url):
    with store._db.driver_autocommit() as raw:
        cursor = statement_cursor(raw)
        assert statement_cursor(raw) is cursor and cursor.connection is raw
        with pytest.raises(psycopg.errors.DivisionByZero):
            cursor.execute("SELECT 1 / 0")
        assert statement_cursor(raw).execute("SELECT 2 AS two").fetchone().two == 2  # rows as named tuples
    with _admin(pg_url) as other:  # another connection: a cursor of its own
        assert statement_cursor(other) is not cursor and statement_cursor(other).connection is other
        statement_cursor(other).close()
        assert not statement_cursor(other).closed  # a closed one is made anew
    gone, kept_cursor = weakref.ref(other), weakref.ref(statement_cursor(other))
    del other
    gc.collect()
    assert gone() is None and kept_cursor() is None  # the connection and its cursor went together


class _Interrupted(BaseException):
    """What a signal handler raises, as Dagster's does on a run's termination."""


def test_a_body_interrupted_mid_statement_raises_its_own_exception_and_its_connection_is_dropped(store):
    """A signal's exception raised while the statement runs leaves the session mid-statement: the caller gets that
    exception (not a store error about switching autocommit), and the connection is neither kept nor pooled."""
    def interrupt(signum, frame):
        raise _Interrupted("terminated")

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted, match="terminated"), store._db.driver_autocommit() as raw:
            raw.execute("SELECT pg_sleep(5)")  # short: the server finds its client gone only once it ends
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert raw.closed  # invalidated: the server's session ends with it
    with store._db.driver_autocommit() as again:
        assert again is not raw and again.execute("SELECT 1").fetchone() == (1,)
