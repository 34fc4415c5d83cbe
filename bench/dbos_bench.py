"""recovery-ext side by side with DBOS (durable execution on PostgreSQL), on the same PostgreSQL, in one run.

1. Per-item checkpoint throughput (``checkpoint_item``, one statement each) vs DBOS step
   throughput (one workflow of N ``@DBOS.step`` calls), alternating rounds.
2. Batched checkpoints (``ctx.items(keys, batch=N)``, 100 and 1,000 items per fenced transaction) vs the
   same DBOS step throughput, each beside a bare multi-row INSERT of the same rows.
3. Mass recovery: N interrupted workflows. recovery-ext: N orphaned pipelines (8 nodes each)
   found, reclaimed and reset by one recovery scan (database side). DBOS: N workflows
   interrupted by a real kill -9 mid-way, then ``DBOS.launch()`` in a new process: the time
   until every one runs again (its interrupted step re-entered).
4. Mass recovery to running again (``--running-again N``, default 100): DBOS as in 3 for N
   workflows, against N orphaned pipelines under a real ``dagster dev`` whose orphan sensor
   requests one resume run each, until every resume run is STARTED and owns its pipeline
   (bench/running_again.py says exactly what is timed and what is checked).

DBOS runs in its own environment (``.venv-dbos``, created on first use with ``pip install
dbos==3.4.0``): it is never a dependency of recovery-ext. All figures are ratios from this run.

Run: .venv/bin/python -m bench.dbos_bench [--items 300] [--rounds 3] [--workflows 500] [--no-dbos]
Goals: per-item >= 5x DBOS steps/s, batched >= 100x, and batched >= 90% of a bare multi-row INSERT of the
same rows (printed beside each batched figure, interleaved with it; bench/batch_bench.py has the detail).
``--no-dbos`` runs only our checkpoints and the bare INSERTs, without DBOS or its environment. Printed beside
them: the rate of one durable commit per item (a bare prepared INSERT, interleaved with our per-item
checkpoints), what any per-item checkpoint that commits every item pays at least.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.batch_bench import bare_unnest, make_bare_tables, running_node, through_ctx_items
from bench.recovery_bench import drop_db, scratch_db
from bench.running_again import running_again
from bench.store_bench import seed_orphans
from recovery_ext.store import RecoverySettings, scan
from recovery_ext._store.models import ItemCheckpoint, PassPlan
from recovery_ext._store.store import RecoveryStore

ROOT = Path(__file__).resolve().parent.parent
DBOS_ENV = ROOT / ".venv-dbos"
DBOS_SIDE = Path(__file__).with_name("dbos_side.py")
DBOS_VERSION = "3.4.0"


def dbos_python() -> str:
    python = DBOS_ENV / "bin" / "python"
    if not python.exists():
        print(f"creating {DBOS_ENV} with dbos=={DBOS_VERSION} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(DBOS_ENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"dbos=={DBOS_VERSION}"], check=True)
    return str(python)


def dbos(mode: str, url: str, count: int) -> dict:
    out = subprocess.run([dbos_python(), str(DBOS_SIDE), mode, url, str(count)], check=True, capture_output=True,
                         text=True, timeout=1800).stdout
    return json.loads(out.strip().splitlines()[-1])


LOADS = {"idle": ("idle",), "loaded": ("loaded",), "both": ("idle", "loaded")}


def machine_load(load: str):
    """The load of a set of rounds: for "loaded", one CPU hog per core (tests/support/hog.py), stopped when the
    block exits."""
    if load == "idle":
        return contextlib.nullcontext()
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from hog import cpu_hog

    return cpu_hog()


def checkpoint_rounds(store: RecoveryStore, ours_url: str, dbos_url: str | None, items: int,
                      rounds: int) -> dict[str, float]:
    """Median rates of ``rounds`` rounds, each DBOS then ours, so load changes hit both sides alike. Each
    batched figure is measured beside a bare INSERT of the same rows (bench/batch_bench.py), interleaved."""
    rates: dict[str, list[float]] = {"dbos": [], "floor": [], "item": [], "batch": [], "bare": [], "big": [],
                                     "big_bare": []}
    with psycopg.connect(ours_url, autocommit=True) as conn:
        make_bare_tables(conn)
        for round_no in range(rounds):
            if dbos_url is not None:
                result = dbos("steps", dbos_url, items)
                rates["dbos"].append(result["steps"] / result["seconds"])
            ours, floor = per_item_beside_one_commit(store, ours_url, items, round_no)
            rates["item"].append(ours)
            rates["floor"].append(floor)
            for size, mine, bare in ((100, "batch", "bare"), (1000, "big", "big_bare")):
                count = items * (10 if size == 100 else 20)
                rates[mine].append(batched(store, count, f"{round_no}-{size}", batch=size))
                own = running_node(store, f"bare-{round_no}-{size}")
                rates[bare].append(count / bare_unnest(conn, "rx_bench_bare", own, count, size))
    return {name: statistics.median(values) if values else float("nan") for name, values in rates.items()}


def print_checkpoints(load: str, rates: dict[str, float], rounds: int) -> None:
    steps, floor, item = rates["dbos"], rates["floor"], rates["item"]
    hogs = "one CPU hog per core" if load == "loaded" else "no CPU hog"
    versus = f"DBOS {DBOS_VERSION} steps" if steps == steps else "a bare INSERT (DBOS not run: --no-dbos)"
    print(f"checkpoints vs {versus}, same PostgreSQL, median of {rounds} alternating rounds, {load} ({hogs})")

    def times(rate: float) -> str:
        return f"{rate / steps:5.1f}x" if steps == steps else "     "

    if steps == steps:
        print(f"  DBOS step                      {steps:9.0f} /s   1.0x")
    print(f"  one durable commit per item    {floor:9.0f} /s   {times(floor)}   (a bare prepared INSERT per "
          "autocommit on one connection, interleaved with ours: what any checkpoint that commits each item pays)")
    print(f"  recovery-ext per item          {item:9.0f} /s   {times(item)}   (goal >= 5x; "
          f"{item / floor:.0%} of one bare durable commit's rate)")
    for size, mine, bare in ((100, "batch", "bare"), (1000, "big", "big_bare")):
        goal = "; goal >= 100x" if size == 100 else ""
        print(f"  recovery-ext batched ({size:>4})   {rates[mine]:9.0f} /s   {times(rates[mine])}   "
              f"(ctx.items(batch={size}); {rates[mine] / rates[bare]:.0%} of the bare INSERT{goal})")
        print(f"  bare INSERT of the same rows   {rates[bare]:9.0f} /s   {times(rates[bare])}   "
              f"({size} rows per autocommit INSERT ... SELECT FROM unnest, same table shape, no fence)", flush=True)


def per_item_beside_one_commit(store: RecoveryStore, url: str, count: int, round_no: int,
                               chunk: int = 20) -> tuple[float, float]:
    """Per-item checkpoints, and beside them one durable commit per item: a bare prepared INSERT of one
    key, each its own autocommit transaction, on one connection to the same server (synchronous_commit on,
    as for DBOS and for our checkpoints). The two alternate in chunks of ``chunk`` items, so both see the
    same load; returns both rates (items per second). The bare commit is what any checkpoint that commits
    every item pays at least; under CPU load its WAL flush, then the wait to be scheduled again, is most of
    an item's time."""
    own = running_node(store, f"per-item-{round_no}")
    store.pipelines.checkpoint_item(own, "items", ItemCheckpoint("warm-up", 0))
    ours = bare = 0.0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS rx_bench_one_commit (item_key text PRIMARY KEY)")
        conn.execute("TRUNCATE rx_bench_one_commit")
        conn.execute("INSERT INTO rx_bench_one_commit VALUES (%s)", ("warm-up",), prepare=True)
        for first in range(0, count, chunk):
            keys = range(first, min(count, first + chunk))
            start = time.perf_counter()
            for i in keys:
                store.pipelines.checkpoint_item(own, "items", ItemCheckpoint(f"item-{i}", {"i": i}))
            ours += time.perf_counter() - start
            start = time.perf_counter()
            for i in keys:
                conn.execute("INSERT INTO rx_bench_one_commit VALUES (%s)", (f"item-{i}",), prepare=True)
            bare += time.perf_counter() - start
    return count / ours, count / bare


def batched(store: RecoveryStore, count: int, tag: str, batch: int = 100) -> float:
    """Items per second through ``ctx.items(keys, batch=N)``, the loop an op body runs."""
    return count / through_ctx_items(store, running_node(store, f"batched-{tag}"), count, batch)


def dbos_recovery(url: str, workflows: int) -> dict:
    """N DBOS workflows interrupted by kill -9 mid-way, then recovered by a new process."""
    worker = subprocess.Popen([dbos_python(), str(DBOS_SIDE), "interrupt", url, str(workflows)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError("the DBOS worker did not get its workflows mid-way")
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)
    return dbos("recover", url, workflows)


def ours_recovery(url: str, orphans: int) -> float:
    store = RecoveryStore(url)
    try:
        store.migrate()
        with psycopg.connect(url, autocommit=True) as conn:
            seed_orphans(conn, orphans, "mass")
            conn.execute("ANALYZE")
        start = time.perf_counter()
        result = scan(store, PassPlan(launching=True, limit=orphans, trigger="bench"), settings=RecoverySettings())
        seconds = time.perf_counter() - start
        if result.reclaimed != orphans:
            raise RuntimeError(f"reclaimed {result.reclaimed} of {orphans} orphans: {result.error}")
        return seconds
    finally:
        store.close()


def add_running_again_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--running-again", type=int, default=100, metavar="N",
                        help="orphaned pipelines / interrupted workflows until running again (0 skips)")
    parser.add_argument("--running-again-concurrency", type=int, default=4, metavar="K",
                        help="Dagster run queue max_concurrent_runs for the resume runs (one process per run)")


def mass_recovery_db_side(workflows: int) -> None:
    ours_url, dbos_url = scratch_db(), scratch_db()
    try:
        recovered = dbos_recovery(dbos_url, workflows)
        ours = ours_recovery(ours_url, workflows)
        print(f"mass recovery of {workflows} interrupted workflows / orphaned pipelines (8 nodes each), DB side")
        print(f"  DBOS launch() returned         {recovered['launch_seconds']:9.2f} s   (recovery goes on in the "
              "background)")
        print(f"  DBOS running again             {recovered['running_again_seconds']:9.2f} s   1.0x")
        print(f"  recovery-ext scan (DB side)    {ours:9.2f} s   "
              f"{recovered['running_again_seconds'] / ours:5.1f}x (found, reclaimed, reset, reserved)")
    finally:
        drop_db(ours_url)
        drop_db(dbos_url)


def mass_recovery_running_again(count: int, concurrency: int) -> None:
    """DBOS and recovery-ext from "recovery can begin" until every one of ``count`` runs again."""
    dbos_url = scratch_db()
    try:
        theirs = dbos_recovery(dbos_url, count)["running_again_seconds"]
    finally:
        drop_db(dbos_url)
    ours = running_again(count, concurrency)
    seconds = ours["all_running_again_seconds"]
    print(f"mass recovery of {count} interrupted workflows / orphaned pipelines, to running again")
    print(f"  DBOS running again             {theirs:9.2f} s   1.0x   (launch() in a new process until every "
          "interrupted step re-entered)")
    print(f"  recovery-ext running again     {seconds:9.2f} s   {theirs / seconds:5.3f}x   (heartbeats expired until "
          f"every resume run STARTED and owns its pipeline: {seconds / theirs:.0f} times DBOS's time)")
    print(f"    resume runs created          {ours['first_created_seconds']:9.2f} s first, "
          f"{ours['all_created_seconds']:.2f} s all;  running again {ours['first_running_again_seconds']:.2f} s "
          f"first, {ours['median_running_again_seconds']:.2f} s median;  "
          f"all finished {ours['all_finished_seconds']:.2f} s")
    print(f"    (real dagster dev on 127.0.0.1, Dagster storage on PostgreSQL, orphan sensor every 1 s, job "
          f"{ours['job']}, QueuedRunCoordinator max_concurrent_runs {concurrency}: one run worker process per "
          "run; checked: one resume run each, all attached, succeeded, pipelines completed)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_running_again_arguments(parser)  # --running-again N, --running-again-concurrency K
    parser.add_argument("--items", type=int, default=300, help="checkpoints / DBOS steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=500, help="interrupted workflows for mass recovery (0 skips)")
    parser.add_argument(
        "--no-dbos",
        action="store_true",
        help="skip every DBOS figure (no .venv-dbos needed): our checkpoints beside the bare INSERT only",
    )
    parser.add_argument("--load", choices=sorted(LOADS), default="both",
                        help="checkpoint rounds on the machine as it is (idle), with one CPU hog per core (loaded), "
                             "or both, one table each")
    args = parser.parse_args()
    # `kill <pid>` unwinds like Ctrl-C, so the CPU hogs are stopped and the scratch databases dropped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.no_dbos:
        dbos_python()
    ours_url, dbos_url = scratch_db(), (None if args.no_dbos else scratch_db())
    store = RecoveryStore(ours_url)
    try:
        store.migrate()
        for load in LOADS[args.load]:
            with machine_load(load):
                rates = checkpoint_rounds(store, ours_url, dbos_url, args.items, args.rounds)
            print_checkpoints(load, rates, args.rounds)
    finally:
        store.close()
        drop_db(ours_url)
        if dbos_url is not None:
            drop_db(dbos_url)
    if args.no_dbos:
        return 0
    if args.workflows:
        mass_recovery_db_side(args.workflows)
    if args.running_again:
        mass_recovery_running_again(args.running_again, args.running_again_concurrency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
