"""A scrape answers within its own timeout: a table locked by another connection (PostgreSQL ACCESS EXCLUSIVE,
SQLite's exclusive lock) gives recovery_database_up 0 while the lock is still held, and no other sample, so
nothing read before is shown as if it were read now."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from recovery_ext._observe.exporter import RecoveryCollector


def samples(collector: RecoveryCollector) -> dict[str, float]:
    return {s.name: s.value for family in collector.collect() for s in family.samples}


@contextmanager
def locked(store, collector: RecoveryCollector) -> Iterator[None]:
    """The tables the scrape reads, locked by another connection until the block ends."""
    if store.dialect.name == "postgresql":
        with psycopg.connect(store.url.set(drivername="postgresql").render_as_string(hide_password=False)) as conn:
            conn.execute("LOCK TABLE rx_pipeline_counts IN ACCESS EXCLUSIVE MODE")  # in a transaction: held
            yield
            conn.rollback()
        return
    for engine in {store.engine, collector.store.engine}:
        engine.dispose()  # an exclusive lock in WAL mode needs the file to itself
    raw = sqlite3.connect(store.url.database, isolation_level=None)
    try:
        raw.execute("PRAGMA locking_mode = EXCLUSIVE")
        raw.execute("BEGIN EXCLUSIVE")
        raw.execute("INSERT INTO rx_circuit_breakers (endpoint, updated_at) VALUES ('held', 0)")
        yield
        raw.execute("ROLLBACK")
    finally:
        raw.close()


def test_a_locked_database_is_up_zero_within_the_scrape_timeout_with_no_stale_sample(store):
    store.pipelines.create_pipeline("etl", ["n"], owner="run-1")
    collector = RecoveryCollector(store, timeout=1.0)
    fresh = samples(collector)
    assert fresh["recovery_database_up"] == 1.0 and fresh["recovery_pipelines"] == 1.0

    answered: dict[str, float] = {}
    with locked(store, collector):
        scrape = threading.Thread(target=lambda: answered.update(samples(collector)), daemon=True)
        scrape.start()
        scrape.join(20)  # the lock stays held far longer than the scrape timeout, and the store's own 30 s
        assert not scrape.is_alive(), "the scrape waited for the lock instead of answering"
    assert answered["recovery_database_up"] == 0.0
    assert set(answered) == {"recovery_database_up", "recovery_scrape_duration_seconds"}
    assert samples(collector)["recovery_database_up"] == 1.0  # the lock is gone: read again, fresh


def test_a_store_with_short_timeouts_is_scraped_through_itself(store):
    collector = RecoveryCollector(store, timeout=store.dialect.statement_timeout)
    assert collector.store is store and samples(collector)["recovery_database_up"] == 1.0
