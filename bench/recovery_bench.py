"""Crash recovery under a real `dagster dev`, measured (issue: Dagster integration benchmark).

1. Detection-to-resume latency over N kills of kind a (kill -9 of the run worker) and kind b
   (host loss: kill -9 of the code server, the run worker and its step, then a code-location reload).
2. Business-logic calls repeated per crash: recovery-ext vs stock Dagster's run_retries FROM_FAILURE
   on an equivalent job (same 4 nodes x 6 items, killed at the same point).
3. Resume runs created for 100 orphans in one tick vs a plain sensor yielding 100 RunRequests.

Run: .venv/bin/python -m bench.recovery_bench   (PostgreSQL at 127.0.0.1:5432 for the application
tables; Dagster storage is SQLite in a scratch DAGSTER_HOME). RECOVERY_BENCH_KILLS sets N (default 10).
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from dagster import DagsterRunStatus, RunsFilter
from sqlalchemy import text

from recovery_pipelines.devserver import DagsterDev, cmdline, parent_of, wait_for
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import PipelineLimits
from recovery_ext._store.store import RecoveryStore

ROOT = Path(__file__).resolve().parent.parent
DEFS = ROOT / "tests" / "support" / "e2e_defs.py"
ADMIN = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
KILLS = int(os.environ.get("RECOVERY_BENCH_KILLS", "10"))
ITEMS = 6
NODES = ("n1", "n2", "n3", "n4")


def config(item_seconds=0.5, n2_seconds=1.0):
    cfg = {"ops": {n: {"config": {"items": ITEMS, "item_seconds": item_seconds}} for n in NODES}}
    cfg["ops"]["n2"]["config"]["item_seconds"] = n2_seconds
    return cfg


def scratch_db() -> str:
    name = f"rx_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return ADMIN.rsplit("/", 1)[0] + "/" + name


def drop_db(url: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


@contextmanager
def scratch_store() -> Iterator[tuple[str, RecoveryStore]]:
    """A migrated store on a scratch PostgreSQL database (its psycopg URL, the store), dropped afterwards."""
    url = scratch_db()
    store = RecoveryStore(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        store.migrate()
        yield url, store
    finally:
        store.close()
        drop_db(url)


def calls(store, run_ids):
    with store.engine.connect() as conn:
        try:
            return conn.execute(text("SELECT run_id, node, item, pid, ppid FROM e2e_calls WHERE run_id = ANY(:r) "
                                     "ORDER BY id"), {"r": list(run_ids)}).all()
        except Exception:  # noqa: BLE001 - the table appears with the first call
            return []


def start(env, home, dagster_yaml=""):
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n" + dagster_yaml)
    return DagsterDev(DEFS, home, env).start()


def one_crash(dev, store, kind: str) -> dict:
    run_id = dev.launch("items_job", config())
    rows = wait_for(lambda: len(calls(store, [run_id])) > ITEMS + 1 and calls(store, [run_id]), timeout=120,
                    what="n2 to be mid-way")
    step = next(r for r in rows if r.node == "n2")
    victims = [step.ppid]
    if kind == "b":
        grpc = parent_of(step.ppid)
        proxy = parent_of(grpc)
        victims = [step.pid, step.ppid, grpc] + ([proxy] if "code-server" in cmdline(proxy) else [])
    pipeline = store.pipelines.find_pipeline(run_id)
    killed = time.time()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    if kind == "b":
        dev.reload()
    resume = wait_for(
        lambda: [r for r in dev.runs(tags={TAG_PIPELINE: str(pipeline.id)}) if TAG_RESUME_NUMBER in r.tags],
        timeout=180,
        what="a resume run",
    )[0]
    record = dev.instance.get_run_records(filters=RunsFilter(run_ids=[resume.run_id]))[0]
    created = record.create_timestamp.timestamp()
    started = wait_for(lambda: (_r := dev.run(resume.run_id)).status in (DagsterRunStatus.STARTED,
                                                                         DagsterRunStatus.SUCCESS)
                       and dev.instance.get_run_records(filters=RunsFilter(run_ids=[resume.run_id]))[0],
                       timeout=120, what="the resume run to start")
    dev.wait_run(resume.run_id, timeout=180)
    wait_for(lambda: store.pipelines.get_pipeline(pipeline.id).status == "completed", timeout=60, what="completion")
    time.sleep(1.0)  # let the superseded step finish refusing its writes before counting calls
    all_calls = calls(store, [run_id, resume.run_id])
    unique = {(c.node, c.item) for c in all_calls}
    return {"detect_to_resume_created": created - killed,
            "detect_to_resume_started": (started.start_time or time.time()) - killed,
            "repeated_calls": len(all_calls) - len(unique), "complete": len(unique) == len(NODES) * ITEMS}


def stock_config():
    return {"ops": {f"stock_{op}": cfg for op, cfg in config()["ops"].items()}}


def stock_crash(dev, store) -> dict:
    run_id = dev.launch("stock_items_job", stock_config())
    rows = wait_for(lambda: len(calls(store, [run_id])) > ITEMS + 1 and calls(store, [run_id]), timeout=120,
                    what="stock n2 to be mid-way")
    step = next(r for r in rows if r.node == "n2")
    killed = time.time()
    os.kill(step.ppid, signal.SIGKILL)
    retry = wait_for(lambda: dev.runs(tags={"dagster/parent_run_id": run_id}), timeout=120,
                     what="stock Dagster's retry run")[0]
    record = dev.instance.get_run_records(filters=RunsFilter(run_ids=[retry.run_id]))[0]
    dev.wait_run(retry.run_id, timeout=180)
    time.sleep(8)  # the orphaned step of the killed run keeps going; let it finish its items
    all_calls = calls(store, [run_id, retry.run_id])
    unique = {(c.node, c.item) for c in all_calls}
    concurrent = {(c.node, c.item) for c in all_calls if c.run_id == run_id and c.node == "n2"} & {
        (c.node, c.item) for c in all_calls if c.run_id == retry.run_id}
    return {"detect_to_resume_created": record.create_timestamp.timestamp() - killed,
            "repeated_calls": len(all_calls) - len(unique), "n2_items_run_twice": len(concurrent)}


def summary(label, values):
    values = sorted(values)
    p95 = values[max(0, int(round(len(values) * 0.95)) - 1)]
    return (
        f"{label:58} n={len(values):3}  median {statistics.median(values):7.2f}  p95 {p95:7.2f}  max {values[-1]:7.2f}"
    )


def creation_rate(home_root: Path, app_url: str) -> list[str]:
    flag = home_root / "burst.flag"
    env = {"RECOVERY_DATABASE_URL": app_url, "E2E_SENSOR_INTERVAL": "1", "E2E_BURST_FLAG": str(flag),
           "E2E_HEARTBEAT_TIMEOUT": "3", "E2E_MAX_PER_TICK": "100"}
    dev = start(env, home_root / "rate_home", "run_queue:\n  max_concurrent_runs: 0\n")
    store = RecoveryStore(app_url)
    lines = []
    try:
        owners = [f"dead-{uuid.uuid4().hex[:6]}-{i}" for i in range(100)]
        for owner in owners:
            store.pipelines.create_pipeline("items_job", list(NODES), owner=owner, origin_run_id=owner,
                                  limits=PipelineLimits(heartbeat_timeout=0.001),
                                  params=config())
        made = time.time()
        wait_for(lambda: len([r for r in dev.instance.get_runs() if TAG_RESUME_NUMBER in r.tags]) >= 100, timeout=300,
                 interval=0.5, what="100 resume runs")
        ours = sorted(r.create_timestamp.timestamp() for r in dev.instance.get_run_records()
                      if TAG_RESUME_NUMBER in r.dagster_run.tags)
        flag.write_text("go")
        wait_for(lambda: len(dev.instance.get_runs(filters=RunsFilter(tags={"bench": "plain"}))) >= 100, timeout=300,
                 interval=0.5, what="100 plain runs")
        plain = sorted(r.create_timestamp.timestamp() for r in dev.instance.get_run_records(
            filters=RunsFilter(tags={"bench": "plain"})))
        lines.append(f"{'100 resume runs (orphan sensor, one tick)':58} first after {ours[0] - made:5.2f} s, "
                     f"100 in {ours[-1] - ours[0]:5.2f} s = {99 / (ours[-1] - ours[0]):5.1f} runs/s")
        lines.append(f"{'100 RunRequests (plain sensor, one tick)':58} {'':17} "
                     f"100 in {plain[-1] - plain[0]:5.2f} s = {99 / (plain[-1] - plain[0]):5.1f} runs/s")
    finally:
        dev.stop()
        store.close()
    return lines


def main() -> int:
    app_url = scratch_db()
    root = Path(tempfile.mkdtemp(prefix="rx-bench-"))
    env = {"RECOVERY_DATABASE_URL": app_url, "E2E_SENSOR_INTERVAL": "1", "E2E_HEARTBEAT_INTERVAL": "1",
           "E2E_HEARTBEAT_TIMEOUT": "3", "E2E_MAX_RESUMES": "3"}
    dev = start(env, root / "home", "run_retries:\n  enabled: true\n  max_retries: 1\n")
    store = RecoveryStore(app_url)
    store.migrate()
    results = {"a": [], "b": []}
    try:
        for kind in ("a", "b"):
            for i in range(KILLS):
                results[kind].append(one_crash(dev, store, kind))
                print(f"kind {kind} #{i + 1}: {results[kind][-1]}", file=sys.stderr, flush=True)
        stock = []
        for i in range(max(3, KILLS // 2)):
            stock.append(stock_crash(dev, store))
            print(f"stock #{i + 1}: {stock[-1]}", file=sys.stderr, flush=True)
    finally:
        dev.stop()
    rate = creation_rate(root, app_url)
    store.close()
    drop_db(app_url)
    print("\nlatency from kill -9 to the resume run (seconds)")
    for kind, label in (("a", "a: run worker killed"), ("b", "b: host loss (code server + worker), incl. reload")):
        print(summary(f"{label}: resume run created", [r["detect_to_resume_created"] for r in results[kind]]))
        print(summary(f"{label}: resume run started", [r["detect_to_resume_started"] for r in results[kind]]))
    print("\nbusiness-logic calls repeated per crash (4 nodes x 6 items; kill -9 mid n2)")
    ours = [r["repeated_calls"] for r in results["a"]]
    print(summary("recovery-ext (kind a)", ours))
    print(summary("recovery-ext (kind b)", [r["repeated_calls"] for r in results["b"]]))
    print(summary("stock Dagster run_retries FROM_FAILURE", [r["repeated_calls"] for r in stock]))
    print(summary("stock: n2 items run by both runs at once (zombie step)", [r["n2_items_run_twice"] for r in stock]))
    print(summary("stock: kill -9 to retry run created (s)", [r["detect_to_resume_created"] for r in stock]))
    assert all(r["complete"] for r in results["a"] + results["b"])
    print("\nrun creation")
    for line in rate:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
