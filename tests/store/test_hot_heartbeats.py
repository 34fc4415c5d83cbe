"""Heartbeats at the speed of the database (PostgreSQL): one statement per pulse, HOT updates only,
a small connection footprint."""

from __future__ import annotations

import time

import psycopg
from sqlalchemy import event

from recovery_ext._store.runs import NodeBeat, PipelineBeat
from recovery_ext._store.store import RecoveryStore


def _update_counts(pg_url: str) -> dict[str, tuple[int, int]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname IN ('rx_pipelines', 'rx_nodes')")}


def _settled(pg_url: str, minimum: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The counters once they include at least ``minimum`` updates (they arrive asynchronously)."""
    deadline = time.monotonic() + 60
    while True:
        counts = _update_counts(pg_url)
        if all(counts[t][0] >= n for t, n in minimum.items()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def test_a_pulse_is_one_statement_and_every_heartbeat_update_is_hot(pg_url):
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        owned = []
        for i in range(20):
            own = store.create_pipeline("job", ["a", "b"], owner=f"run-{i}")
            store.start_node(own, "a")
            owned.append(own)
        lost = store.create_pipeline("job", ["a"], owner="gone")
        store.fail_pipeline(lost.pipeline_id, "for the test")
        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, stmt, *a: statements.append(stmt))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # an autovacuum ANALYZE running meanwhile holds a snapshot that keeps old row versions
            # from being pruned, so an update could find its page full: not what this test measures
            conn.execute("ALTER TABLE rx_pipelines SET (autovacuum_enabled = false)")
            conn.execute("ALTER TABLE rx_nodes SET (autovacuum_enabled = false)")
        store.engine.dispose()  # a backend that exits flushes its statistics
        before = _settled(pg_url, {"rx_pipelines": 21, "rx_nodes": 20})  # start_node x 20, fail_pipeline
        assert {t: n for t, (n, _) in before.items()} == {"rx_pipelines": 21, "rx_nodes": 20}
        pulses = 25
        for _ in range(pulses):
            assert store.pulse([PipelineBeat(o, 30) for o in owned] + [PipelineBeat(lost, 30)],
                               [NodeBeat(o, "a", 30) for o in owned]) == {lost.pipeline_id}
        assert len(statements) == pulses  # one statement per pulse, whatever the number of beats
        expected = pulses * len(owned)
        store.engine.dispose()
        after = _settled(pg_url, {t: before[t][0] + expected for t in before})
        updates = {t: after[t][0] - before[t][0] for t in after}
        hot = {t: after[t][1] - before[t][1] for t in after}
        assert updates == {"rx_pipelines": expected, "rx_nodes": expected}
        assert hot == updates  # no index covers a heartbeat column: every pulse updated in place
    finally:
        store.close()


def test_a_run_worker_keeps_a_small_pool(pg_url):
    store = RecoveryStore(pg_url)
    try:
        assert (store.engine.pool.size(), store.engine.pool._max_overflow) == (2, 8)
        assert not store.engine.pool._pre_ping
    finally:
        store.close()
