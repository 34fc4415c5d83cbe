"""The hot path's driver connection (``driver_autocommit``) on a real PostgreSQL: whatever ends its body, the
connection goes back to the pool out of autocommit mode, or is invalidated when the server ended its session,
and a driver error reaches the caller as the store's own error."""

from __future__ import annotations

import psycopg
import pytest

from recovery_ext._errors import StoreError, StoreUnavailable
from recovery_ext._store.store import RecoveryStore


@pytest.fixture
def store(pg_url):
    store = RecoveryStore(pg_url, retry_budget=0)
    store.migrate()
    yield store
    store.close()


def test_a_statement_runs_in_autocommit_and_the_connection_goes_back_transactional(store):
    with store._db.driver_autocommit() as raw:
        assert raw.autocommit is True
        raw.execute("CREATE TABLE rx_autocommit_probe (id int)")  # committed at once: no transaction is open
        assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert raw.autocommit is False and not raw.closed
    with store._db.read() as conn:  # another session sees it: it was committed
        assert conn.exec_driver_sql("SELECT count(*) FROM rx_autocommit_probe").scalar() == 0


def test_an_error_of_the_body_propagates_as_it_is(store):
    with pytest.raises(KeyError, match="mine"), store._db.driver_autocommit() as raw:
        raise KeyError("mine")
    assert raw.autocommit is False and not raw.closed


def test_a_driver_error_is_the_stores_error_and_the_connection_stays_usable(store):
    with pytest.raises(StoreError, match="syntax error") as caught, store._db.driver_autocommit() as raw:
        raw.execute("SELEKT 1")
    assert not isinstance(caught.value, StoreUnavailable)  # a bad statement is not retried
    assert isinstance(caught.value.__cause__, psycopg.errors.SyntaxError)
    assert raw.autocommit is False and not raw.closed
    with store._db.driver_autocommit() as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_a_session_the_server_ended_is_unavailable_and_its_connection_leaves_the_pool(store, pg_url):
    with pytest.raises(StoreUnavailable) as caught, store._db.driver_autocommit() as raw:
        with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (raw.info.backend_pid,))
        raw.execute("SELECT 1")
    assert caught.value.session_lost is True
    assert raw.closed  # invalidated: the pool opens a new connection for the next call
    with store._db.driver_autocommit() as fresh:
        assert fresh is not raw and fresh.execute("SELECT 1").fetchone() == (1,)


def test_a_server_that_cannot_be_reached_is_unavailable():
    store = RecoveryStore("postgresql+psycopg://postgres@127.0.0.1:1/nothing_listens_here", retry_budget=0)
    try:
        with pytest.raises(StoreUnavailable, match="database unavailable"), store._db.driver_autocommit():
            pytest.fail("no connection, so the body never runs")
    finally:
        store.close()
