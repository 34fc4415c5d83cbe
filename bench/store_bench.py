"""Recovery-store benchmark on PostgreSQL with 1,000,000 finished pipelines (8 nodes each) in the tables.

Measures: find + reclaim + reset of 1,000 and then 10,000 orphans (8 nodes each), the orphan
query and a whole recovery scan when there are no orphans, and one batched heartbeat for 100 nodes.

Run: .venv/bin/python -m bench.store_bench   (PostgreSQL at 127.0.0.1:5432; a scratch database is
created and dropped). RECOVERY_BENCH_HISTORY changes the history size.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid

import psycopg

from recovery_ext._store.models import Ownership, PassPlan
from recovery_ext.store import RecoverySettings, scan
from recovery_ext._store.store import RecoveryStore

ADMIN = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
HISTORY = int(os.environ.get("RECOVERY_BENCH_HISTORY", "1000000"))


def timed(fn, repeat=1):
    samples = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - start) * 1000)
    return result, samples


def seed_history(conn, n: int) -> None:
    conn.execute("""
        INSERT INTO rx_pipelines (job_name, params, status, owner, epoch, resume_count, max_resumes,
                                  created_at, started_at, updated_at, completed_at)
        SELECT 'history', '{}'::jsonb, CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'completed' END, 'run-' || g, 1, 0, 3,
               now() - interval '30 days', now() - interval '30 days', now() - interval '29 days',
               now() - interval '29 days'
        FROM generate_series(1, %s) g""", (n,))
    conn.execute("""
        INSERT INTO rx_nodes (pipeline_id, name, position, status, optional, attempts, updated_at, completed_at)
        SELECT p.id, 'node' || k, k, 'completed', false, 1, p.updated_at, p.completed_at
        FROM rx_pipelines p CROSS JOIN generate_series(0, 7) k WHERE p.job_name = 'history'""")


def seed_orphans(conn, n: int, tag: str) -> None:
    conn.execute("""
        INSERT INTO rx_pipelines (job_name, params, status, owner, epoch, heartbeat_at, heartbeat_deadline,
                                  resume_count, max_resumes, created_at, started_at, updated_at, current_node)
        SELECT 'bench', '{"ops": {}}'::jsonb, 'running', %s || '-' || g, 1, now() - interval '5 min',
               now() - interval '3 min', 0, 3, now() - interval '10 min', now() - interval '10 min', now(), 'node3'
        FROM generate_series(1, %s) g""", (tag, n))
    conn.execute("""
        INSERT INTO rx_nodes (pipeline_id, name, position, status, optional, attempts, updated_at)
        SELECT p.id, 'node' || k, k, CASE WHEN k < 3 THEN 'completed' WHEN k = 3 THEN 'running' ELSE 'pending' END,
               false, CASE WHEN k <= 3 THEN 1 ELSE 0 END, now()
        FROM rx_pipelines p CROSS JOIN generate_series(0, 7) k WHERE p.owner LIKE %s""", (tag + "-%",))


def main() -> None:
    name = f"rx_bench_{uuid.uuid4().hex[:8]}"
    admin = ADMIN.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + "/" + name
    store = RecoveryStore(url)
    try:
        store.migrate()
        raw = url.replace("postgresql://", "postgresql://", 1)
        with psycopg.connect(raw, autocommit=True) as conn:
            t = time.perf_counter()
            seed_history(conn, HISTORY)
            conn.execute("ANALYZE")
            print(f"history: {HISTORY:,} finished pipelines, {HISTORY * 8:,} nodes "
                  f"(seeded in {time.perf_counter() - t:.0f} s)")
        settings = RecoverySettings(max_per_scan=100_000, max_age_seconds=None)
        rows = []
        for n in (1_000, 10_000):
            with psycopg.connect(raw, autocommit=True) as conn:
                seed_orphans(conn, n, f"dead{n}")
                conn.execute("ANALYZE rx_pipelines")
                conn.execute("ANALYZE rx_nodes")
            found, find_ms = timed(lambda: store.recovery.find_orphans())
            stats, scan_ms = timed(lambda: scan(store, PassPlan(launching=True, trigger="bench"), settings=settings))
            assert len(found) == n and stats.reclaimed == n, (len(found), stats.as_dict())
            assert sum(len(r.reset_nodes) for r in stats.reclaimed_pipelines) == n
            rows.append((f"{n:,} orphans x 8 nodes: find", find_ms[0]))
            rows.append((f"{n:,} orphans x 8 nodes: whole scan (find, reclaim, reset, history, events)", scan_ms[0]))
        _, empty_query = timed(lambda: store.recovery.find_orphans(), repeat=50)
        _, empty_scan = timed(lambda: scan(store, PassPlan(trigger="bench"), settings=settings), repeat=30)
        rows.append(("orphan query, no orphans (median of 50)", statistics.median(empty_query)))
        rows.append(("whole recovery scan, no orphans (median of 30)", statistics.median(empty_scan)))
        live = store.reports.list_pipelines(status="running", job_name="bench", limit=100)
        beats = [(Ownership(p.id, p.epoch, p.owner), "node3") for p in live]
        store.pipelines.heartbeat(beats, timeout=90)
        _, hb = timed(lambda: store.pipelines.heartbeat(beats, timeout=90), repeat=50)
        assert not store.pipelines.heartbeat(beats, timeout=90)
        rows.append(("batched heartbeat, 100 nodes (median of 50)", statistics.median(hb)))
        with store.engine.connect() as conn:
            plan = conn.exec_driver_sql(
                "EXPLAIN SELECT id FROM rx_pipelines WHERE status NOT IN ('completed', 'failed') "
                "AND status = 'running' AND heartbeat_deadline < now()").all()
        print(f"\n{'measurement':78} {'ms':>10}")
        for label, ms in rows:
            print(f"{label:78} {ms:10.1f}")
        print("\norphan query plan:\n  " + "\n  ".join(r[0] for r in plan))
    finally:
        store.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
