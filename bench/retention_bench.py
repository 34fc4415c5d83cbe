"""Retention beside live work: ``prune_finished_pipelines`` deleting a history while a pipeline checkpoints items.

For each database (SQLite, PostgreSQL): seed HISTORY finished pipelines that ended 100 days ago, each with
3 nodes, 10 item checkpoints, 10 ledger rows, 8 transitions, 2 events and a completed queue item it held
(about 35 rows a pipeline). Then a live pipeline checkpoints one item per call in a thread, as a node does:

* **before**: the writer alone for SECONDS;
* **during**: the writer while ``prune_finished_pipelines(90 days)`` deletes the whole history in batches of
  200 pipelines (each its own transaction);
* **after**: the writer alone again (the machine's noise, side by side).

Prints, per phase, checkpoints per second and the checkpoint's latency (median, p95, p99, max), the ratio
of during to before, and the prune's own figures: pipelines and rows deleted, wall time, batch time
(median, p95, max); on PostgreSQL also how often a session of the database was seen waiting on a lock
during the prune (sampled every 10 ms). Nothing is asserted on time.

Run: .venv/bin/python -m bench.retention_bench   (PostgreSQL at 127.0.0.1:5432; a scratch database is created
and dropped). RX_RETENTION_BENCH_HISTORY sets the pipelines (default 20000 on PostgreSQL, a quarter on SQLite),
RX_RETENTION_BENCH_SECONDS the baseline phases (default 5).

Figures from ``python -m bench.retention_bench`` (defaults) on 2 shared cores, with three other helpers' tests
and a CI run on the same machine (2026-11-27), so "before" and "after" differ by the machine's noise alone:

    SQLite: pruned 5000 pipelines, 175000 rows, in 31.5 s (159 pipelines/s); 100 batches,
            batch ms median 93.4  p95 424.1  max 1582.8
      before       559 checkpoints/s   latency ms: median 0.36  p95 11.31  p99 16.81  max  47.79
      during       369 checkpoints/s   latency ms: median 0.37  p95 14.14  p99 38.12  max 169.76
      after        466 checkpoints/s   latency ms: median 0.37  p95 13.13  p99 20.89  max  49.17
      during/before: rate 0.66x, median latency 1.03x, p99 2.27x
    PostgreSQL: pruned 20000 pipelines, 700000 rows, in 41.7 s (480 pipelines/s); 100 batches,
            batch ms median 389.0  p95 647.3  max 1357.9
      lock waits: 0 of 1854 samples of pg_stat_activity during the prune saw a session waiting on a lock
      before       177 checkpoints/s   latency ms: median 4.16  p95 15.75  p99 21.39  max  30.06
      during       109 checkpoints/s   latency ms: median 7.56  p95 21.24  p99 33.78  max 262.07
      after        145 checkpoints/s   latency ms: median 5.90  p95 16.50  p99 23.35  max  39.61
      during/before: rate 0.61x, median latency 1.82x, p99 1.58x

An earlier run on a quieter moment: PostgreSQL 1069 pipelines/s, batch median 177 ms, writer 0.73x rate,
median latency 1.33x, p99 1.38x; SQLite writer 0.49x rate, p99 2.64x. On PostgreSQL no session ever waited
on a lock: what the writer loses is CPU, shared by the prune, the database and the writer on two cores. On
SQLite a writer waits for at most the batch holding the lock (50 pipelines; its median 93 ms here, the long
tail is the loaded machine and SQLite's WAL checkpoints) and gets the lock between batches.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import insert, select

from recovery_ext._store.models import ItemCheckpoint, Ownership
from recovery_ext._store.models import PruneResult
from recovery_ext._store.schema import events, node_items, nodes, pipelines, provider_calls, queue_items, transitions
from recovery_ext._store.store import RecoveryStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from databases import pg_database  # noqa: E402 - the test suite's throw-away databases

HISTORY = int(os.environ.get("RX_RETENTION_BENCH_HISTORY", "20000"))
SECONDS = float(os.environ.get("RX_RETENTION_BENCH_SECONDS", "5"))
DAY = 86400.0
CHUNK = 500  # pipelines seeded per transaction


def seed(store: RecoveryStore, n: int) -> None:
    """``n`` finished pipelines with their history, inserted in chunks through the store's own tables."""
    ended = store.dialect.now_plus(-100 * DAY)
    for start in range(0, n, CHUNK):
        runs = [f"h-{i}" for i in range(start, min(n, start + CHUNK))]
        with store.write() as conn:
            conn.execute(insert(pipelines).values(completed_at=ended, created_at=ended, updated_at=ended),
                         [{"job_name": "history", "params": {}, "status": "completed" if i % 10 else "failed",
                           "owner": r, "origin_run_id": r, "epoch": 1} for i, r in enumerate(runs)])
            ids = list(conn.scalars(select(pipelines.c.id).where(pipelines.c.origin_run_id.in_(runs))))
            conn.execute(insert(nodes), [{"pipeline_id": p, "name": f"n{k}", "position": k, "status": "completed"}
                                         for p in ids for k in range(3)])
            conn.execute(insert(node_items), [{"pipeline_id": p, "node_name": "n0", "item_key": f"k{k}",
                                               "result": {"k": k}} for p in ids for k in range(10)])
            conn.execute(insert(provider_calls), [
                {"id": uuid.uuid4().hex, "pipeline_id": p, "node_name": "n0", "item_key": f"k{k}", "endpoint": "x",
                 "model": "m", "tokens_in": 100, "tokens_out": 50, "outcome": "ok", "cost": 0.01,
                 "reached_checkpoint": True} for p in ids for k in range(10)])
            queued = conn.execute(insert(queue_items).returning(queue_items.c.id, queue_items.c.holder_pipeline_id),
                                  [{"queue": "docs", "dedupe_key": f"d-{p}", "payload": {}, "status": "completed",
                                    "holder_pipeline_id": p, "holder_epoch": 1} for p in ids]).all()
            conn.execute(insert(transitions), [
                {"entity_type": "node", "entity_id": p, "pipeline_id": p, "from_status": "pending",
                 "to_status": "running", "event": f"e{k}"} for p in ids for k in range(6)]
                + [{"entity_type": "pipeline", "entity_id": p, "pipeline_id": p, "from_status": "running",
                    "to_status": "completed", "event": "completed"} for p in ids]
                + [{"entity_type": "queue_item", "entity_id": q, "pipeline_id": p, "from_status": "ready",
                    "to_status": "processing", "event": "claimed"} for q, p in queued])
            conn.execute(insert(events), [{"kind": "note", "pipeline_id": p, "payload": {}}
                                          for p in ids for _ in range(2)])


class Writer(threading.Thread):
    """A live node checkpointing one item per call, timing each; ``phase`` names where each sample goes."""

    def __init__(self, store: RecoveryStore, own: Ownership) -> None:
        super().__init__(daemon=True)
        self.store, self.own = store, own
        self.phase = "before"
        self.samples: dict[str, list[float]] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                self.store.pipelines.checkpoint_item(self.own, "a", ItemCheckpoint(f"live-{n}", {"n": n}))
                self.samples.setdefault(self.phase, []).append((time.perf_counter() - started) * 1000)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the bench
            self.error = exc


class LockWaits(threading.Thread):
    """PostgreSQL: samples ``pg_stat_activity`` every 10 ms for sessions of this database waiting on a lock (a
    writer the prune would block); counts the samples that saw one."""

    def __init__(self, store: RecoveryStore) -> None:
        super().__init__(daemon=True)
        self.store, self.samples, self.waiting = store, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        with self.store.engine.connect() as conn:
            while not self.stop.is_set():
                waiting = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'").scalar()
                conn.rollback()
                self.samples += 1
                self.waiting += bool(waiting)
                time.sleep(0.01)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def line(label: str, samples: list[float], seconds: float) -> str:
    return (f"  {label:<7} {len(samples) / seconds:8.0f} checkpoints/s   latency ms: median "
            f"{statistics.median(samples):6.2f}  p95 {quantile(samples, 0.95):6.2f}  "
            f"p99 {quantile(samples, 0.99):7.2f}  max {max(samples):7.2f}")


def run(label: str, url: str, history: int) -> None:
    store = RecoveryStore(url)
    store.migrate()
    try:
        started = time.perf_counter()
        seed(store, history)
        print(f"{label}: seeded {history} finished pipelines in {time.perf_counter() - started:.1f} s")
        own = store.pipelines.create_pipeline("live", ["a"], owner="live", origin_run_id="live")  # also the newest
        store.pipelines.start_node(own, "a")
        writer = Writer(store, own)
        writer.start()
        time.sleep(SECONDS)
        writer.phase = "during"
        batches: list[float] = []
        began = time.perf_counter()

        def progress(result: PruneResult) -> None:
            batches.append(result.last_batch_seconds * 1000)

        locks = LockWaits(store) if store.dialect.row_locks else None
        if locks is not None:
            locks.start()
        result = store.reports.prune_finished_pipelines(90 * DAY, progress=progress)
        pruning = time.perf_counter() - began
        if locks is not None:
            locks.stop.set()
            locks.join()
        writer.phase = "after"
        time.sleep(SECONDS)
        writer.stop.set()
        writer.join()
        if writer.error is not None:
            raise writer.error
        print(f"{label}: pruned {result.pipelines} pipelines, {sum(result.rows.values())} rows, in "
              f"{pruning:.1f} s ({result.pipelines / pruning:.0f} pipelines/s); {result.batches} batches, "
              f"batch ms median {statistics.median(batches):.1f}  p95 {quantile(batches, 0.95):.1f}  "
              f"max {max(batches):.1f}")
        if locks is not None:
            print(f"  lock waits: {locks.waiting} of {locks.samples} samples of pg_stat_activity during the prune "
                  "saw a session waiting on a lock")
        for phase, seconds in (("before", SECONDS), ("during", pruning), ("after", SECONDS)):
            print(line(phase, writer.samples.get(phase, [0.0]), seconds))
        before, during = writer.samples["before"], writer.samples.get("during", [])
        if during:
            print(f"  during/before: rate {len(during) / pruning / (len(before) / SECONDS):.2f}x, median latency "
                  f"{statistics.median(during) / statistics.median(before):.2f}x, p99 "
                  f"{quantile(during, 0.99) / quantile(before, 0.99):.2f}x")
        assert store.pipelines.get_pipeline(own.pipeline_id).status == "running"  # the live pipeline was never touched
    finally:
        store.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run("SQLite", f"sqlite:///{tmp}/bench.sqlite3", max(1, HISTORY // 4))
    with pg_database() as url:
        run("PostgreSQL", url.replace("postgresql://", "postgresql+psycopg://"), HISTORY)


if __name__ == "__main__":
    main()
