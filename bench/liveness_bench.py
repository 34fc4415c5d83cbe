"""Liveness under a real `dagster dev` (issue 8 item 9): false orphans and detection latency.

For each heartbeat setting (interval/timeout) and each machine load (idle, or one CPU hog per
core), one `dagster dev` runs:

- healthy runs of the 4-node multiprocess job (step start-up between nodes, no fault): every
  reclaim of one of them is a false orphan;
- per fault kind, runs killed mid-way, and the latency from the fault to the reclaim
  (the ``pipeline_recovered`` event, on the database clock of the same machine):
  ``worker``  kill -9 of the run worker (multiprocess job)
  ``step``    kill -9 of the step process while its run worker lives
  ``sigstop`` SIGSTOP of the run worker (in-process job), SIGCONT after the reclaim
  ``host``    kill -9 of the code server, the run worker and its step, then a code-location reload

Run:  .venv/bin/python -m bench.liveness_bench --quick
      .venv/bin/python -m bench.liveness_bench --settings default,2/8 --load idle,loaded --healthy 10 --faults 3
Defaults (30 s / 90 s, sensor every 30 s) take about 2-3 minutes per fault; --quick is 2/8 only,
3 healthy runs and 1 fault per kind, on both loads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from bench.recovery_bench import ITEMS, calls, drop_db, scratch_db, start
from recovery_pipelines.devserver import cmdline, parent_of, process_alive, wait_for
from recovery_ext._store.schema import events
from recovery_ext._store.store import RecoveryStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

KINDS = ("worker", "step", "sigstop", "host")
NODES = ("n1", "n2", "n3", "n4")


@dataclass
class Result:
    label: str
    healthy: int = 0
    false_orphans: int = 0
    false_reclaims: int = 0
    latency: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def job_config(item_seconds: float, items: int = ITEMS) -> dict:
    return {"ops": {n: {"config": {"items": items, "item_seconds": item_seconds}} for n in NODES}}


def reclaim_times(store: RecoveryStore, pipeline_id: int) -> list[float]:
    with store.read() as conn:
        rows = conn.execute(select(events.c.created_at).where(events.c.pipeline_id == pipeline_id,
                                                              events.c.kind == "pipeline_recovered"))
        return [r.created_at.timestamp() for r in rows]


def healthy_runs(dev, store: RecoveryStore, count: int, item_seconds: float, result: Result, timeout: float) -> None:
    launched = []
    for _ in range(count):
        launched.append(dev.launch("items_job", job_config(item_seconds)))
        if len(launched) % 2 == 0:  # two at a time: the bench measures liveness, not the queue
            finish(store, launched[-2:], timeout)
    finish(store, launched[-(count % 2):] if count % 2 else [], timeout)
    for run_id in launched:
        pipeline = store.pipelines.find_pipeline(run_id)
        reclaims = len(reclaim_times(store, pipeline.id)) if pipeline else 0
        result.healthy += 1
        result.false_orphans += reclaims > 0
        result.false_reclaims += reclaims


def finish(store: RecoveryStore, run_ids: list[str], timeout: float) -> None:
    for run_id in run_ids:
        pipeline = wait_for(
            lambda r=run_id: store.pipelines.find_pipeline(r), timeout=timeout, what=f"the pipeline of {run_id}"
        )
        wait_for(lambda p=pipeline: store.pipelines.get_pipeline(p.id).status in ("completed", "failed", "canceled"),
                 timeout=timeout, interval=1.0, what=f"pipeline {pipeline.id} to finish")


def one_fault(dev, store: RecoveryStore, kind: str, item_seconds: float, timeout: float) -> float:
    job = "items_job_inprocess" if kind == "sigstop" else "items_job"
    run_id = dev.launch(job, job_config(item_seconds))
    rows = wait_for(lambda: len(calls(store, [run_id])) > ITEMS + 1 and calls(store, [run_id]), timeout=timeout,
                    what="n2 to be mid-way")
    step = next(r for r in rows if r.node == "n2")
    pipeline = store.pipelines.find_pipeline(run_id)
    if kind == "worker":
        victims, sig = [step.ppid], signal.SIGKILL
    elif kind == "step":
        victims, sig = [step.pid], signal.SIGKILL
    elif kind == "sigstop":
        victims, sig = [step.pid], signal.SIGSTOP
    else:
        grpc = parent_of(step.ppid)
        proxy = parent_of(grpc)
        victims = [step.pid, step.ppid, grpc] + ([proxy] if "code-server" in cmdline(proxy) else [])
        sig = signal.SIGKILL
    faulted = time.time()
    for pid in victims:
        os.kill(pid, sig)
    try:
        if kind == "host":
            dev.reload()
        seen = wait_for(lambda: reclaim_times(store, pipeline.id) or ended_unreclaimed(store, pipeline.id),
                        timeout=timeout, what="the reclaim")
        if isinstance(seen, str):
            raise AssertionError(seen)
        detected = seen[0]
    finally:
        if kind == "sigstop" and process_alive(step.pid):
            os.kill(step.pid, signal.SIGCONT)
    wait_for(lambda: store.pipelines.get_pipeline(pipeline.id).status in ("completed", "failed"), timeout=timeout,
             interval=1.0, what="the resumed pipeline to finish")
    return detected - faulted


def ended_unreclaimed(store: RecoveryStore, pipeline_id: int) -> str | None:
    """Why the fault failed, when the pipeline ended without ever being reclaimed: the fault then
    fails at once with the pipeline's error (waiting out the whole timeout would only hide why)."""
    pipeline = store.pipelines.get_pipeline(pipeline_id)
    if pipeline.status in ("completed", "failed", "canceled") and not reclaim_times(store, pipeline_id):
        return f"pipeline {pipeline_id} ended {pipeline.status} without a reclaim: {pipeline.error}"
    return None


def measure(setting: str, loaded: bool, args) -> Result:
    label = f"{setting:>7} {'loaded' if loaded else 'idle':6}"
    result = Result(label)
    interval, timeout = (30.0, 90.0) if setting == "default" else (float(x) for x in setting.split("/"))
    sensor = 30 if setting == "default" else max(1, int(interval))
    # healthy runs last several heartbeat timeouts, so the gaps between steps are tested
    item_seconds = args.item_seconds or max(0.3, 3 * timeout / (4 * ITEMS))
    wait = max(300.0, 12 * timeout)
    url = scratch_db()
    root = Path(tempfile.mkdtemp(prefix="rx-live-"))
    env = {"RECOVERY_DATABASE_URL": url, "E2E_HEARTBEAT_INTERVAL": str(interval),
           "E2E_HEARTBEAT_TIMEOUT": str(timeout), "E2E_STALL_TIMEOUT": "86400", "E2E_SENSOR_INTERVAL": str(sensor),
           "E2E_MAX_RESUMES": "5", "E2E_LAUNCH_GRACE": "300"}
    with contextlib.ExitStack() as stack:
        stack.callback(drop_db, url)
        if loaded:
            from hog import cpu_hog

            stack.enter_context(cpu_hog())
        dev = start(env, root / "home")
        stack.callback(dev.stop)
        store = RecoveryStore(url)
        store.migrate()
        stack.callback(store.close)
        healthy_runs(dev, store, args.healthy, item_seconds, result, wait)
        for kind in args.kinds:
            for _ in range(args.faults):
                try:
                    result.latency.setdefault(kind, []).append(
                        one_fault(dev, store, kind, max(0.3, min(item_seconds, 1.0)), wait))
                except AssertionError as exc:
                    result.errors.append(f"{kind}: {exc}")
                print(f"{label} {kind}: {result.latency.get(kind)}", file=sys.stderr, flush=True)
    return result


def report(results: list[Result]) -> None:
    print("\nfalse orphans (healthy runs reclaimed) and detection latency, fault -> reclaim (s)")
    print(f"{'setting':>7} {'load':6} {'healthy':>8} {'false':>6} {'rate':>6}  " +
          "  ".join(f"{k + ' med/max':>18}" for k in KINDS))
    for r in results:
        rate = r.false_orphans / r.healthy if r.healthy else float("nan")
        cells = []
        for kind in KINDS:
            values = r.latency.get(kind) or []
            cells.append(f"{statistics.median(values):8.1f}/{max(values):<6.1f} n={len(values)}" if values else
                         f"{'-':>18}")
        print(f"{r.label} {r.healthy:8} {r.false_orphans:6} {rate:6.2f}  " + "  ".join(cells))
        for error in r.errors:
            print(f"    error: {error}")


def main() -> int:
    # `kill <pid>` unwinds like Ctrl-C, so the dagster dev and CPU hogs it started are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings", default="default,2/8", help="comma-separated: default (30/90) or INTERVAL/TIMEOUT"
    )
    parser.add_argument("--load", default="idle,loaded", help="comma-separated: idle, loaded (one CPU hog per core)")
    parser.add_argument("--healthy", type=int, default=10, help="healthy runs per setting and load")
    parser.add_argument("--faults", type=int, default=3, help="faults per kind per setting and load")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"fault kinds among {','.join(KINDS)}")
    parser.add_argument("--item-seconds", type=float, default=0.0,
                        help="seconds per item (default: healthy runs last about 3 heartbeat timeouts)")
    parser.add_argument("--quick", action="store_true", help="2/8 only, 3 healthy runs, 1 fault per kind")
    args = parser.parse_args()
    if args.quick:
        args.settings, args.healthy, args.faults = "2/8", 3, 1
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    results = []
    for setting in args.settings.split(","):
        for load in args.load.split(","):
            results.append(measure(setting, load == "loaded", args))
            report(results[-1:])
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
