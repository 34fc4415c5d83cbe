"""History bench: what the periodic and per-pipeline paths cost as the history grows.

A deployment keeps its application tables for years. This seeds a realistic history in bulk
(set-based SQL, bench/sql/history_<dialect>.sql: each finished pipeline has 3 nodes, 10 item
checkpoints, 10 ledger rows, 9 transitions, 2 events, an OCR queue item for a third of them)
beside 330 live pipelines (300 running with fresh heartbeats, 30 orphaned: heartbeat expired),
then grows it size after size in the same database and times at each size (median of
``--repeat`` runs):

- orphan tick: the orphan sensor's read (``tick_snapshot``, one transaction, what every idle tick
  costs) and its recovery pass with nothing to reclaim (``limit=0``: cancel, give up, fail corrupt rows);
- stuck-item tick: the stuck-item sensor's store calls (reset stale items, count ready ones);
- metrics scrape: the Prometheus collector's ``collect()``;
- ``recovery-ext status``, ``costs PIPELINE`` and ``report PIPELINE`` (the CLI in this process);
- resume start: loading a live pipeline's completed items;
- checkpoint: one item with one provider call, by a live pipeline's owner.

Run: .venv/bin/python -m bench.history_bench [--dialect postgresql|sqlite] [--sizes 10000,100000,1000000]
     [--repeat 5] [--status-parts]   (PostgreSQL at $RECOVERY_TEST_PG or 127.0.0.1:5432; a scratch database is
     created and dropped; SQLite in a temporary file). The default is a quick run: 10,000 on PostgreSQL.
Targets (PostgreSQL, 1,000,000 finished pipelines): scrape < 1 s, idle tick < 50 ms in one transaction,
status < 1 s, costs and report of one pipeline independent of the others.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import text

from bench.recovery_bench import drop_db, scratch_db
from recovery_ext._cli import main as cli
from recovery_ext._observe.exporter import RecoveryCollector
from recovery_ext._store.models import ItemCheckpoint, Ownership, PassPlan, ProviderCall, Scope
from recovery_ext._store.store import RecoveryStore

SEED = Path(__file__).resolve().parent / "sql"
JOBS = ("llm_job", "ocr_job", "items_job")
FIRST_FINISHED = 1001  # ids 1..330 are the live pipelines
LIVE = Ownership(1, 1, "live-1")
CHECKPOINTS = itertools.count()  # item keys of the checkpoints timed, across sizes


def sections(dialect: str) -> dict[str, list[str]]:
    """The seed file's statements by section (``-- section: NAME``, statements split at ``-- statement``)."""
    body = (SEED / f"history_{'postgres' if dialect == 'postgresql' else 'sqlite'}.sql").read_text()
    found: dict[str, list[str]] = {}
    for part in re.split(r"^-- section: ", body, flags=re.M)[1:]:
        name, _, rest = part.partition("\n")
        found[name.strip()] = [s.strip() for s in re.split(r"^-- statement\s*$", rest, flags=re.M) if s.strip()]
    return found


def seed(store: RecoveryStore, statements: list[str], **params: int) -> None:
    with store.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement), params)


def maintain(store: RecoveryStore, statements: list[str]) -> None:
    """What autovacuum keeps up on a database a year old: statistics and the visibility map."""
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for statement in statements:
            conn.execute(text(statement))


def disk_bytes(store: RecoveryStore, path: Path | None) -> int:
    if path is not None:
        return sum(f.stat().st_size for f in path.parent.glob(path.name + "*"))
    with store.engine.connect() as conn:
        return int(conn.scalar(text("SELECT pg_database_size(current_database())")))


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def cli_call(url: str, *args: str) -> Callable[[], None]:
    runner = CliRunner()

    def run() -> None:
        result = runner.invoke(cli, ["--database-url", url, *args], catch_exceptions=False)
        if result.exit_code != 0:
            raise AssertionError(f"recovery-ext {' '.join(args)} exited {result.exit_code}: {result.output[-500:]}")
    return run


def operations(store: RecoveryStore, url: str, report_file: Path) -> dict[str, Callable[[], object]]:
    scope = Scope(job_names=JOBS, deployment="default")
    collector = RecoveryCollector(store)
    finished = FIRST_FINISHED + 10  # a finished pipeline with a resume (epoch 2) in its history

    def checkpoint() -> None:
        n = next(CHECKPOINTS)
        call = ProviderCall(endpoint="https://api.example.com/v1/chat", model="model-a", tokens_in=500,
                            tokens_out=200, latency_seconds=1.5, cost=0.0007, item_key=f"bench-{n}",
                            pipeline_id=LIVE.pipeline_id, node_name="llm", run_id=LIVE.owner, epoch=LIVE.epoch)
        store.pipelines.checkpoint_item(
            LIVE, "llm", ItemCheckpoint(key=f"bench-{n}", result={"text": "x"}, calls=(call,))
        )

    def stuck_tick() -> None:
        store.queue.reset_stale(queue="ocr", older_than_seconds=600, reason="history bench")
        store.queue.count_ready("ocr")
        store.queue.count_ready("ocr", waiting=True)

    def scrape() -> None:
        families = list(collector.collect())
        if families[0].samples[0].value != 1.0:
            raise AssertionError("the scrape could not read the database")

    return {
        "orphan tick: read (idle tick)": lambda: store.recovery.tick_snapshot(scope, grace_seconds=300),
        "orphan tick: pass, nothing reclaimed": lambda: store.recovery.recovery_pass(
            PassPlan(limit=0, trigger="history bench"), scope),
        "stuck-item tick": stuck_tick,
        "metrics scrape": scrape,
        "recovery-ext status": cli_call(url, "status", "--json"),
        "recovery-ext costs PIPELINE": cli_call(url, "costs", str(finished), "--json"),
        "recovery-ext report PIPELINE": cli_call(url, "report", str(finished), "--html", str(report_file)),
        "resume start (completed items)": lambda: store.pipelines.completed_items(LIVE.pipeline_id, "llm"),
        "checkpoint (1 item, 1 call)": checkpoint,
    }


def status_parts(store: RecoveryStore) -> dict[str, Callable[[], object]]:
    """Each store read of ``recovery-ext status`` alone (``--status-parts``): which of them grows with history."""
    reports, queue = store.reports, store.queue
    return {
        "status: pipeline_summary": reports.pipeline_summary,
        "status: find_orphans": store.recovery.find_orphans,
        "status: stale_items": lambda: queue.stale_items(older_than_seconds=600),
        "status: waiting_items": queue.waiting_items,
        "status: count_events (2 kinds, 24 h)": lambda: (
            reports.count_events("pipeline_recovered", within_seconds=86400),
            reports.count_events("item_reset", within_seconds=86400)),
        "status: dead_items": reports.dead_items,
        "status: queue_summary": reports.queue_summary,
        "status: waiting_pipelines": store.providers.waiting_pipelines,
        "status: breakers": store.providers.breakers,
        "status: unwatched_pipelines": reports.unwatched_pipelines,
        "status: stranded_pipelines": store.recovery.stranded_pipelines,
        "status: items_with_unknown_status": reports.items_with_unknown_status,
        "status: items_with_bad_values": reports.items_with_bad_values,
        "status: dangling_rows": reports.dangling_rows,
    }


def run(dialect: str, sizes: list[int], repeat: int, parts: bool = False) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="rx-history-"))
    path = tmp / "history.sqlite3" if dialect == "sqlite" else None
    url = f"sqlite:///{path}" if path is not None else scratch_db()
    store = RecoveryStore(url)
    seeds = sections(dialect)
    table: dict[str, dict[int, float]] = {}
    facts: dict[int, tuple[float, int]] = {}
    try:
        store.migrate()
        seed(store, seeds["live"])
        seeded = 0
        for size in sizes:
            started = time.perf_counter()
            # one transaction per 50,000 pipelines: a bounded WAL/undo, the same rows as one statement
            for lo in range(seeded, size, 50_000):
                hi = min(size, lo + 50_000)
                seed(store, seeds["history"], lo=FIRST_FINISHED + lo, hi=FIRST_FINISHED + hi - 1)
                with store.write() as conn:  # what finishing them through the store would have kept
                    store.dialect.roll_up_finished(conn, FIRST_FINISHED + lo, FIRST_FINISHED + hi - 1)
                print(f"  seeded {hi:,} finished pipelines ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)
            maintain(store, seeds["maintain"])
            seconds = time.perf_counter() - started
            seeded = size
            facts[size] = (seconds, disk_bytes(store, path))
            timed = operations(store, url, tmp / "report.html")
            if parts:
                timed.update(status_parts(store))
            for name, fn in timed.items():
                fn()  # warm: connections, compiled statements, the OS cache
                table.setdefault(name, {})[size] = median_ms(fn, repeat)
                print(f"  {size:>9,} {name:40} {table[name][size]:10.1f} ms", file=sys.stderr, flush=True)
    finally:
        store.close()
        if path is None:
            drop_db(url)
    print(f"\nhistory bench, {dialect}: median ms of {repeat} runs against finished pipelines in the history")
    width = max(len(n) for n in table)
    print(f"{'':{width}}" + "".join(f"{size:>12,}" for size in sizes))
    for name, by_size in table.items():
        print(f"{name:{width}}" + "".join(f"{by_size[size]:12.1f}" for size in sizes))
    print(f"{'seed seconds (this step)':{width}}" + "".join(f"{facts[s][0]:12.0f}" for s in sizes))
    print(f"{'disk MB':{width}}" + "".join(f"{facts[s][1] / 2**20:12.0f}" for s in sizes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialect", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--sizes", default="10000", help="comma-separated history sizes, ascending")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--status-parts", action="store_true", help="also time each store read of `status` alone")
    args = parser.parse_args()
    sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(",") if s)
    os.environ.setdefault("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    run(args.dialect, sizes, args.repeat, args.status_parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
