"""What delays a heartbeat registry's pulses on a busy machine: its process, or the database?

One pipeline is pulsed by a :class:`HeartbeatRegistry` thread (``--interval``, ``--timeout``) on a fresh
PostgreSQL database while, in the same process, a thread only sleeps 50 ms at a time (how late it wakes is
how long the process went unscheduled) and a second connection runs ``SELECT 1`` and an autocommit INSERT
every 100 ms (how fast the database answers). The main thread looks for orphans every 100 ms, as the orphan
sensor would. ``--hogs N`` busy loops load the CPUs; ``--churn`` adds a process that creates, migrates and
drops databases, as parallel test workers do. For each orphan seen it prints the pulse gap before it and the
worst sleep overshoot and database latencies of the 3 s before. Prints; asserts nothing.

    .venv/bin/python -m bench.pulse_gap_bench --seconds 120 --hogs 16 --churn
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import psycopg  # noqa: E402
from databases import PG_ADMIN_URL, migrate, pg_conninfo, pg_database  # noqa: E402
from hog import cpu_hog  # noqa: E402

from recovery_ext._liveness.heartbeat import HeartbeatRegistry, HeartbeatSettings  # noqa: E402
from recovery_ext._store.store import RecoveryStore  # noqa: E402


def churn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with pg_database(PG_ADMIN_URL) as url:
            migrate(url)


def sampled(stop: threading.Event, into: list, step) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            into.append(step())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def worst(series: list[tuple[float, float]], before: float, width: float = 3.0) -> float:
    return max((d for t, d in series if before - width <= t <= before), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--churn", action="store_true")
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--timeout", type=float, default=1.0)
    args = parser.parse_args()
    churner = multiprocessing.Process(target=churn, args=(args.seconds,)) if args.churn else None
    with pg_database(PG_ADMIN_URL) as url:
        store = RecoveryStore(url)
        store.migrate()
        own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1", params={})
        pulses: list[tuple[float, float]] = []  # (start, duration) of each pulse
        pulse = store.pipelines.pulse

        def timed(*a, **k):
            started = time.monotonic()
            try:
                return pulse(*a, **k)
            finally:
                pulses.append((started, time.monotonic() - started))

        store.pipelines.pulse = timed  # type: ignore[method-assign]
        stop = threading.Event()
        sleeps: list[tuple[float, float]] = []
        queries: list[tuple[float, float]] = []
        def overslept() -> tuple[float, float]:
            started = time.monotonic()
            time.sleep(0.05)
            return started, time.monotonic() - started - 0.05

        conn = psycopg.connect(pg_conninfo(url), autocommit=True)
        conn.execute("CREATE TABLE probe (n int)")

        def query() -> tuple[float, float]:
            started = time.monotonic()
            conn.execute("SELECT 1").fetchone()
            conn.execute("INSERT INTO probe VALUES (1)")
            took = time.monotonic() - started
            time.sleep(0.1)
            return started, took

        threads = [sampled(stop, sleeps, overslept), sampled(stop, queries, query)]
        registry = HeartbeatRegistry(store)
        lease = registry.register(own, HeartbeatSettings(interval=args.interval, timeout=args.timeout))
        orphans: list[float] = []
        if churner is not None:
            churner.start()
        with cpu_hog(args.hogs) if args.hogs else contextlib.nullcontext():
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                if store.recovery.find_orphans():
                    orphans.append(time.monotonic())
                time.sleep(0.1)
        lease.release()
        stop.set()
        for thread in threads:
            thread.join()
        conn.close()
        if churner is not None:
            churner.join()
        starts = [s for s, _ in pulses]
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        print(f"hogs={args.hogs} churn={args.churn} seconds={args.seconds:g} interval={args.interval:g} "
              f"timeout={args.timeout:g}: {len(pulses)} pulses, {len(orphans)} orphan sightings")
        print(f"pulse gap max {max(gaps):.3f} s, median {statistics.median(gaps):.3f} s; pulse call max "
              f"{max(d for _, d in pulses):.3f} s; sleep overshoot max {max(d for _, d in sleeps):.3f} s; "
              f"SELECT 1 + INSERT max {max(d for _, d in queries):.3f} s")
        for seen in orphans:
            before = [(s, d) for s, d in pulses if s < seen]
            gap = before[-1][0] - before[-2][0] if len(before) > 1 else float("nan")
            print(f"orphan at {seen - starts[0]:.2f} s: pulse gap before it {gap:.3f} s; in the 3 s before, sleep "
                  f"overshoot {worst(sleeps, seen):.3f} s, pulse call {worst(pulses, seen):.3f} s, "
                  f"SELECT 1 + INSERT {worst(queries, seen):.3f} s")
        store.close()


if __name__ == "__main__":
    main()
