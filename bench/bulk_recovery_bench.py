"""Bulk recovery (issue 11 item 2): one orphan-sensor tick over thousands of orphans.

1. Tick cost: N orphans (the owner runs Dagster shows FAILURE, as after a mass kill of run
   workers) in the application tables on PostgreSQL; one evaluation of the orphan sensor against
   a real local Dagster instance reclaims all of them and returns their RunRequests. Reported:
   tick seconds, reclaimed, requests, and a second tick (nothing left to reclaim, every
   reservation still waiting for its run) to show the steady-state cost.
2. Run creation in one daemon: the orphan sensor's RunRequests for M orphans vs a plain sensor
   yielding M RunRequests, in the same `dagster dev` (QueuedRunCoordinator with
   max_concurrent_runs 0, so creation is measured, not execution). Ratio = ours / plain.

Run: .venv/bin/python -m bench.bulk_recovery_bench [--orphans 1000,10000] [--runs 300] [--hog]
Goals: 1,000 orphans < 5 s, 10,000 < 10 s in one tick, run creation >= 0.9x the plain sensor.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dagster import DagsterRunStatus, RunsFilter, build_sensor_context
from dagster._core.test_utils import create_run_for_test, instance_for_test
from sqlalchemy import insert, update

from bench.recovery_bench import NODES, config, drop_db, scratch_db, start
from recovery_pipelines.devserver import wait_for
from recovery_ext import RecoveryResource, make_orphan_sensor
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import LEGACY_DEPLOYMENT
from recovery_ext._store.schema import nodes, pipelines
from recovery_ext._store.store import RecoveryStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))


def seed_orphans(store: RecoveryStore, owners: list[str], deployment: str = LEGACY_DEPLOYMENT) -> None:
    """N running pipelines with 4 nodes each (one running), inserted in bulk; their owners are dead runs.
    ``deployment``: the sensor's own (a legacy row would first be adopted, one tick before its reclaim)."""
    now = store.dialect.now()
    with store.write() as conn:
        for start_at in range(0, len(owners), 1000):
            part = owners[start_at:start_at + 1000]
            ids = conn.execute(
                insert(pipelines).values(created_at=now, updated_at=now, heartbeat_at=now,
                                         heartbeat_deadline=store.dialect.now_plus(600)).returning(pipelines.c.id),
                [{"job_name": "items_job", "deployment": deployment, "origin_run_id": o, "params": config(),
                  "status": "running", "owner": o,
                  "epoch": 1, "resume_count": 0, "max_resumes": 3} for o in part]).scalars().all()
            conn.execute(insert(nodes).values(updated_at=now), [
                {"pipeline_id": pid, "name": n, "position": i, "status": "running" if i == 1 else
                 ("completed" if i == 0 else "pending"), "optional": False, "attempts": 1 if i < 2 else 0}
                for pid in ids for i, n in enumerate(NODES)])


def tick_cost(count: int, profile: bool = False) -> list[str]:
    from e2e_defs import items_job

    url = scratch_db()
    store = RecoveryStore(url)
    store.migrate()
    lines = []
    try:
        with instance_for_test() as instance:
            started = time.perf_counter()
            owners = [create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE).run_id
                      for _ in range(count)]
            resource = RecoveryResource(database_url=url)
            seed_orphans(store, owners, resource.deployment_name(instance))
            setup = time.perf_counter() - started
            sensor = make_orphan_sensor([items_job], minimum_interval_seconds=30)
            for label in ("tick 1: reclaim, request all", "tick 2: all still waiting"):
                ctx = build_sensor_context(instance=instance, resources={"recovery": resource})
                profiler = cProfile.Profile() if profile and label.startswith("tick 1") else None
                t0 = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                result = sensor.evaluate_tick(ctx)
                seconds = time.perf_counter() - t0
                if profiler is not None:
                    profiler.disable()
                    out = io.StringIO()
                    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
                    stats.print_stats(r"recovery_ext|dagster/_core", 25)
                    lines.append(out.getvalue())
                lines.append(f"{count:6} orphans, {label:26} {seconds:7.2f} s   requests {len(result.run_requests):6}"
                             f"   ({setup:.0f} s to seed)")
            with store.read() as conn:
                from sqlalchemy import func, select

                reclaimed = conn.scalar(select(func.count()).where(pipelines.c.epoch == 2))
            lines.append(f"{count:6} orphans: {reclaimed} reclaimed (epoch 2), expected {count}")
    finally:
        store.close()
        drop_db(url)
    return lines


def creation_ratio(runs: int) -> list[str]:
    url = scratch_db()
    root = Path(tempfile.mkdtemp(prefix="rx-bulk-"))
    flag = root / "burst.flag"
    env = {"RECOVERY_DATABASE_URL": url, "E2E_SENSOR_INTERVAL": "1", "E2E_BURST_FLAG": str(flag),
           "E2E_BURST_COUNT": str(runs), "E2E_HEARTBEAT_TIMEOUT": "3"}
    dev = start(env, root / "home", "run_queue:\n  max_concurrent_runs: 0\n")
    store = RecoveryStore(url)
    store.migrate()
    try:
        owners = [f"gone-{uuid.uuid4().hex[:8]}-{i}" for i in range(runs)]
        seed_orphans(store, owners)
        with store.write() as conn:  # every heartbeat expired at once: all orphans in the next tick
            conn.execute(update(pipelines).values(heartbeat_deadline=store.dialect.now_plus(-1)))
        made = time.time()
        wait_for(lambda: len(dev.instance.get_run_ids(filters=RunsFilter(tags={TAG_RESUME_NUMBER: "1"}))) >= runs,
                 timeout=1800, interval=1.0, what=f"{runs} resume runs")
        ours = sorted(r.create_timestamp.timestamp() for r in dev.instance.get_run_records()
                      if TAG_RESUME_NUMBER in r.dagster_run.tags)
        flag.write_text("go")
        wait_for(lambda: len(dev.instance.get_run_ids(filters=RunsFilter(tags={"bench": "plain"}))) >= runs,
                 timeout=1800, interval=1.0, what=f"{runs} plain runs")
        plain = sorted(r.create_timestamp.timestamp() for r in dev.instance.get_run_records(
            filters=RunsFilter(tags={"bench": "plain"})))
        # the orphan sensor kept ticking (re-requesting every reservation) all along: still one run each
        resumed = [r.tags[TAG_PIPELINE]
                   for r in dev.instance.get_runs(filters=RunsFilter(tags={TAG_RESUME_NUMBER: "1"}))]
        if len(resumed) != runs or len(set(resumed)) != runs:
            raise AssertionError(f"{len(resumed)} resume runs for {len(set(resumed))} of {runs} pipelines")
        ours_rate = (len(ours) - 1) / (ours[-1] - ours[0])
        plain_rate = (len(plain) - 1) / (plain[-1] - plain[0])
        return [f"{runs} resume runs (orphan sensor): first {ours[0] - made:6.2f} s after the orphans appeared, "
                f"{ours_rate:6.2f} runs/s",
                f"{runs} RunRequests (plain sensor):                                     {plain_rate:6.2f} runs/s",
                f"run creation ratio orphan/plain = {ours_rate / plain_rate:.2f} (goal >= 0.9)"]
    finally:
        dev.stop()
        store.close()
        drop_db(url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orphans", default="1000,10000", help="comma-separated orphan counts for the tick cost")
    parser.add_argument("--runs", type=int, default=300, help="runs for the creation-rate comparison (0 skips it)")
    parser.add_argument("--hog", action="store_true", help="keep one busy process per core running (loaded machine)")
    parser.add_argument("--profile", action="store_true", help="print where the first tick's time goes (cProfile)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.hog:
            from hog import cpu_hog

            stack.enter_context(cpu_hog())
        lines = []
        for count in (int(c) for c in args.orphans.split(",") if c):
            lines += tick_cost(count, args.profile)
            print(lines[-3:], file=sys.stderr, flush=True)
        if args.runs:
            lines += creation_ratio(args.runs)
    print(f"\nbulk recovery ({'with a CPU hog per core' if args.hog else 'no hog'}; load average "
          f"{os.getloadavg()[0]:.1f})")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
