"""Heartbeats at the speed of the database (PostgreSQL): one statement per pulse that changes no indexed
column on pages with room (HOT updates, measured on a private server), a small connection footprint."""

from __future__ import annotations

import re
import time

import psycopg
from sqlalchemy import event

from pg_cluster import PrivateCluster
from recovery_ext._store.models import NodeBeat, PipelineBeat
from recovery_ext._store.store import RecoveryStore
import store_rows


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


def _indexed_columns(conn, table: str) -> set[str]:
    """Every column an index of ``table`` covers, in its key, its expressions or its predicate: a change to
    any of them makes PostgreSQL write new index entries instead of updating the row in place (HOT)."""
    columns = {r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass", (table,))}
    every = {r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (table,))}
    for (text,) in conn.execute("SELECT coalesce(pg_get_expr(indexprs, indrelid), '') || ' ' || "
                                "coalesce(pg_get_expr(indpred, indrelid), '') FROM pg_index "
                                "WHERE indrelid = %s::regclass", (table,)):
        columns |= {c for c in every if re.search(rf"\b{c}\b", text)}
    return columns


def _rows(conn, table: str, columns: set[str]) -> list[tuple]:
    names = ", ".join(sorted(columns))
    return conn.execute(f"SELECT id, {names} FROM {table} ORDER BY id").fetchall()


def _owned_pipelines(store: RecoveryStore):
    owned = []
    for i in range(20):
        own = store.pipelines.create_pipeline("job", ["a", "b"], owner=f"run-{i}")
        store.pipelines.start_node(own, "a")
        owned.append(own)
    lost = store.pipelines.create_pipeline("job", ["a"], owner="gone")
    store_rows.fail_pipeline(store, lost.pipeline_id, "for the test")
    return owned, lost


def _pulse(store: RecoveryStore, owned, lost) -> None:
    assert store.pipelines.pulse([PipelineBeat(o, 30) for o in owned] + [PipelineBeat(lost, 30)],
                       [NodeBeat(o, "a", 30) for o in owned]) == {lost.pipeline_id}


def test_a_pulse_is_one_statement_that_changes_no_indexed_column_on_pages_with_room(pg_url):
    """What the design guarantees, whatever else the server is doing: the tables keep room on each page
    (fillfactor), and a heartbeat (a pulse, a watcher's vouch) changes no column any index covers, so
    PostgreSQL may update the row in place. Whether it does also depends on other sessions' snapshots
    (they keep old row versions from being pruned): that is measured on a private server below."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        owned, lost = _owned_pipelines(store)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            fillfactors = dict(conn.execute(
                "SELECT relname, reloptions FROM pg_class WHERE relname IN ('rx_pipelines', 'rx_nodes')").fetchall())
            assert fillfactors == {"rx_pipelines": ["fillfactor=50"], "rx_nodes": ["fillfactor=50"]}
            indexed = {t: _indexed_columns(conn, t) for t in ("rx_pipelines", "rx_nodes")}
            assert {"status", "id"} <= indexed["rx_pipelines"] and "pipeline_id" in indexed["rx_nodes"]
            before = {t: _rows(conn, t, indexed[t]) for t in indexed}
            beats_before = conn.execute("SELECT max(heartbeat_at) FROM rx_nodes").fetchone()[0]
        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, stmt, *a: statements.append(stmt))
        for _ in range(5):
            _pulse(store, owned, lost)
        assert len(statements) == 5  # one statement per pulse, whatever the number of beats
        with psycopg.connect(pg_url, autocommit=True) as conn:  # a watcher's vouch and death report, too
            conn.execute("UPDATE rx_nodes SET watcher = 'w', process = 'h/1/1' WHERE status = 'running'")
            before["rx_nodes"] = _rows(conn, "rx_nodes", indexed["rx_nodes"])
        watched = store.pipelines.watched_nodes("w")
        assert store.pipelines.vouch_nodes("w", watched[:10], watched[10:], 30) == len(owned)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            after = {t: _rows(conn, t, indexed[t]) for t in indexed}
            assert conn.execute("SELECT max(heartbeat_at) FROM rx_nodes").fetchone()[0] > beats_before  # it did beat
        assert after == before  # no indexed column changed
    finally:
        store.close()


def test_on_a_server_of_its_own_every_heartbeat_update_is_hot():
    """The ratio, where no other session holds a snapshot that keeps old row versions from being pruned."""
    cluster = PrivateCluster().init()
    cluster.start()
    url = cluster.create_database("hot")
    store = RecoveryStore(url)
    try:
        store.migrate()
        owned, lost = _owned_pipelines(store)
        with psycopg.connect(url, autocommit=True) as conn:
            # this server's own autovacuum ANALYZE would hold such a snapshot too
            conn.execute("ALTER TABLE rx_pipelines SET (autovacuum_enabled = false)")
            conn.execute("ALTER TABLE rx_nodes SET (autovacuum_enabled = false)")
        store._db.kept.release()  # the hot path's kept connection back to the pool, then closed with it:
        store.engine.dispose()  # a backend that exits flushes its statistics
        before = _settled(url, {"rx_pipelines": 21, "rx_nodes": 20})  # start_node x 20, fail_pipeline
        assert {t: n for t, (n, _) in before.items()} == {"rx_pipelines": 21, "rx_nodes": 20}
        pulses = 25
        for _ in range(pulses):
            _pulse(store, owned, lost)
        expected = pulses * len(owned)
        store._db.kept.release()
        store.engine.dispose()
        after = _settled(url, {t: before[t][0] + expected for t in before})
        updates = {t: after[t][0] - before[t][0] for t in after}
        hot = {t: after[t][1] - before[t][1] for t in after}
        assert updates == {"rx_pipelines": expected, "rx_nodes": expected}
        assert hot == updates  # every pulse updated in place
    finally:
        store.close()
        cluster.destroy()


def test_a_run_worker_keeps_a_small_pool(pg_url):
    store = RecoveryStore(pg_url)
    try:
        assert (store.engine.pool.size(), store.engine.pool._max_overflow) == (2, 8)
        assert not store.engine.pool._pre_ping
    finally:
        store.close()
