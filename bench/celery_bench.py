"""Recovery on Dagster's Celery executor, with worker hosts as network namespaces (tests/support/celery_cluster.py).

One deployment (PostgreSQL and Redis in the root namespace, `dagster dev` with the shipped
multi-host instance config, a run host and up to 4 worker hosts), then:

1. **Detection latency and false orphans, Celery beside multiprocess, in one run.** Healthy
   pipelines of the same 3-node job run on both executors (``celery_items_job``: steps on worker
   hosts; ``mp_items_job``: steps as subprocesses of the run worker, under a second `dagster dev`
   with the default run launcher on the same PostgreSQL); any reclaim
   among them is a false orphan. Then, per executor, ``--faults`` kills mid-step: Celery kills the
   worker host running the step (link down, kill -9 of everything in it), multiprocess kills -9 the
   step's process. Detection latency is the reclaim's time (database clock) minus the kill.
2. **Throughput over 1, 2 and 4 worker hosts.** N pipelines launched at once on the Celery job;
   wall time from the launch to the last completion, pipelines per minute, and the scale-out
   ratio against one host.

    PYTHONPATH=$PWD python -m bench.celery_bench [--healthy 6] [--faults 3] [--pipelines 8] [--load loaded|idle]

Needs root (network namespaces), redis-server and PostgreSQL 15's initdb. Prints tables; asserts nothing on time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from celery_cluster import CeleryDeployment  # noqa: E402
from hog import cpu_hog  # noqa: E402
from sqlalchemy import select, text  # noqa: E402

from recovery_ext import RecoveryStore  # noqa: E402
from recovery_ext._store.schema import transitions  # noqa: E402
from recovery_pipelines.devserver import wait_for  # noqa: E402

INTERVAL, TIMEOUT, TICK = 1.0, 5.0, 1.0


def config(items=4, item_seconds=0.5, **nodes):
    cfg = {"ops": {n: {"config": {"items": items, "item_seconds": item_seconds}} for n in ("n1", "n2", "n3")}}
    for node, values in nodes.items():
        cfg["ops"][node]["config"].update(values)
    return cfg


def calls(store, run_id, node):
    with store.engine.connect() as conn:
        try:
            return conn.execute(text("SELECT host, pid FROM celery_calls WHERE run_id = :r AND node = :n ORDER BY id"),
                                {"r": run_id, "n": node}).all()
        except Exception:  # noqa: BLE001 - the table appears with the first call
            return []


def reclaim_times(store, pipeline_id):
    with store.read() as conn:
        return [r.timestamp() for r in conn.execute(select(transitions.c.at).where(
            transitions.c.pipeline_id == pipeline_id, transitions.c.event == "reclaimed")).scalars()]


def pipeline_of(store, run_id):
    return wait_for(lambda: store.pipelines.find_pipeline(run_id), timeout=180, what=f"the pipeline of {run_id}")


def wait_completed(store, pipeline_ids, timeout=600):
    wait_for(lambda: all(store.pipelines.get_pipeline(p).status == "completed" for p in pipeline_ids), timeout=timeout,
             interval=0.5, what=f"pipelines {pipeline_ids} to complete")


def healthy(dep, store, job, n, dev=None):
    runs = [(dev or dep.dev).launch(job, config()) for _ in range(n)]
    pipelines = [pipeline_of(store, r).id for r in runs]
    wait_completed(store, pipelines)
    return sum(1 for p in pipelines if reclaim_times(store, p))


def fault(dep, store, job, dev=None):
    dev = dev or dep.dev
    run_id = dev.launch(job, config(n2={"items": 6, "item_seconds": 1.5}))
    rows = wait_for(lambda: len(c := calls(store, run_id, "n2")) >= 2 and c, timeout=240, what="n2 mid-way")
    pipeline = pipeline_of(store, run_id).id
    killed_at = time.time()
    if job == "celery_items_job":
        host = dep.host_named(rows[0].host)
        host.kill()
    else:
        os.kill(rows[0].pid, 9)
        host = None
    try:
        wait_for(lambda: reclaim_times(store, pipeline), timeout=120, what="the reclaim")
        latency = reclaim_times(store, pipeline)[0] - killed_at
        wait_completed(store, [pipeline])
    finally:
        if host is not None:
            host.reconnect()
            dep.start_worker(host)
            dep.wait_workers([host])
    return latency


def throughput(dep, store, n):
    start = time.monotonic()
    runs = [dep.dev.launch("celery_items_job", config()) for _ in range(n)]
    pipelines = [pipeline_of(store, r).id for r in runs]
    wait_completed(store, pipelines, timeout=1800)
    return time.monotonic() - start


@contextlib.contextmanager
def multiprocess_side(dep):
    """The same job on the multiprocess executor: a second `dagster dev` (default run launcher, run
    workers and step processes on this host), on databases of its own in the same PostgreSQL."""
    import shutil
    import tempfile

    import psycopg

    from recovery_pipelines.devserver import DagsterDev

    with psycopg.connect(dep.pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE dagster_mp")
        conn.execute("CREATE DATABASE app_mp")
    home = Path(tempfile.mkdtemp(prefix="rx-celery-home-mp-"))
    shutil.copy(Path(__file__).resolve().parent.parent / "deploy" / "celery" / "dagster.yaml", home / "dagster.yaml")
    env = dep.env_at("127.0.0.1", "control")
    env.update({"DAGSTER_PG_URL": dep.pg.url_at("127.0.0.1", "dagster_mp", scheme="postgresql+psycopg2"),
                "RECOVERY_DATABASE_URL": dep.pg.url_at("127.0.0.1", "app_mp")})
    app_store = RecoveryStore(env["RECOVERY_DATABASE_URL"])
    app_store.migrate()
    saved = os.environ["DAGSTER_PG_URL"]
    os.environ["DAGSTER_PG_URL"] = env["DAGSTER_PG_URL"]
    dev = DagsterDev(dep.defs_file, home, env)
    try:
        dev.start(timeout=300)
        yield dev, app_store
    finally:
        dev.stop()
        os.environ["DAGSTER_PG_URL"] = saved
        app_store.close()
        shutil.rmtree(home, ignore_errors=True)


def set_worker_hosts(dep, count):
    """Exactly ``count`` worker hosts serve the step queue; the others' workers are stopped."""
    for i, host in enumerate(dep.worker_hosts):
        running = bool(host.pids())
        if i < count and not running:
            dep.start_worker(host)
        elif i >= count and running:
            for pid in host.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            wait_for(lambda h=host: not h.pids(), timeout=30, what=f"{host.name} to stop")
    dep.wait_workers(dep.worker_hosts[:count])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--healthy", type=int, default=6, help="healthy pipelines per executor")
    parser.add_argument("--faults", type=int, default=3, help="mid-step kills per executor")
    parser.add_argument("--pipelines", type=int, default=8, help="concurrent pipelines for the throughput part")
    parser.add_argument("--hosts", default="1,2,4", help="worker host counts for the throughput part")
    parser.add_argument("--load", choices=["loaded", "idle"], default="loaded", help="a CPU hog per core, or none")
    args = parser.parse_args()
    host_counts = [int(h) for h in args.hosts.split(",")]
    hog = cpu_hog() if args.load == "loaded" else contextlib.nullcontext()
    dep = CeleryDeployment(worker_hosts=max(host_counts + [2]), run_concurrency=max(args.pipelines, 4), env={
        "CELERY_E2E_HEARTBEAT_INTERVAL": str(INTERVAL), "CELERY_E2E_HEARTBEAT_TIMEOUT": str(TIMEOUT),
        "CELERY_E2E_SENSOR_INTERVAL": str(int(TICK))})
    with hog:
        dep.start()
        store = RecoveryStore(dep.app_url)
        try:
            print(f"\nCelery bench: {os.cpu_count()} cores, load {args.load}; heartbeat {INTERVAL:g} s, "
                  f"timeout {TIMEOUT:g} s, sensor tick {TICK:g} s", flush=True)
            set_worker_hosts(dep, 2)
            rows = []
            with multiprocess_side(dep) as (mp_dev, mp_store):
                for job, label, dev, st in (("celery_items_job", "celery (2 worker hosts)", dep.dev, store),
                                            ("mp_items_job", "multiprocess", mp_dev, mp_store)):
                    false = healthy(dep, st, job, args.healthy, dev)
                    latencies = [fault(dep, st, job, dev) for _ in range(args.faults)]
                    rows.append((label, false, args.healthy, latencies))
                    print(f"  {label}: {false}/{args.healthy} false orphans; detection "
                          f"{', '.join(f'{x:.1f}' for x in latencies)} s", flush=True)
            print("\n| executor | fault | false orphans | detection latency median (min-max) |")
            print("|---|---|---|---|")
            for label, false, n, lat in rows:
                what = "worker host killed" if label.startswith("celery") else "step process kill -9"
                print(f"| {label} | {what} | {false}/{n} | {statistics.median(lat):.1f} s "
                      f"({min(lat):.1f}-{max(lat):.1f}) |")
            results = []
            for count in host_counts:
                set_worker_hosts(dep, count)
                wall = throughput(dep, store, args.pipelines)
                results.append((count, wall))
                print(f"  {count} worker host(s): {args.pipelines} pipelines in {wall:.1f} s", flush=True)
            base = results[0][1]
            print(f"\n| worker hosts | {args.pipelines} pipelines (3 nodes x 4 items x 0.5 s) | pipelines/min | "
                  f"scale-out vs {results[0][0]} |")
            print("|---|---|---|---|")
            for count, wall in results:
                print(f"| {count} | {wall:.1f} s | {60 * args.pipelines / wall:.1f} | {base / wall:.2f}x |")
        finally:
            store.close()
            dep.stop()


if __name__ == "__main__":
    main()
