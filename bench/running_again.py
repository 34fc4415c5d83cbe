"""recovery-ext's mass recovery "to running again" under a real `dagster dev`, for bench/dbos_bench.py.

N pipelines of ``items_job_inprocess`` (tests/e2e_defs.py: 4 recoverable nodes) are left the way
a host loss leaves them: their first runs stay STARTED in Dagster (nothing is left to report them
failed), n1 completed with its output recorded, n2 running with one item checkpointed, and then
every run heartbeat expires in one UPDATE. That commit is t0: from then on the orphan sensor can
see all N orphans. The orphan sensor of a real `dagster dev` (daemon, code server, Dagster storage
on PostgreSQL) reclaims them, requests one resume run each, Dagster's run queue launches them.

A pipeline is **running again** once its resume run owns it and is STARTED: timed, from the run's
own event log, as the later of its RUN_START event and the run worker's "attached to pipeline <id>
as resume #1" entry (written right after the attaching UPDATE committed). The figure is the time
from t0 until the last of the N is running again.

The outcome is checked, and anything else raises: every pipeline has exactly one resume run (and
no second resume), every resume run attached and succeeded, every pipeline ended completed and
owned by its resume run.

The resume runs go through Dagster's QueuedRunCoordinator, ``max_concurrent_runs`` K (4 by
default in dbos_bench): every run is its own run worker process, and they are CPU-bound on 2
cores. K=8 measured no faster than K=4 for N=100 (278 s against 275 s), only heavier.

Why not a real kill -9 of N run workers: Dagster starts one run worker process per run, and N of
them alive at once (to be killed mid-way, as DBOS's N workflows in one process are) do not fit on
2 cores. The seeded rows are what such a kill leaves behind, written through the store's own API.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from dagster import DagsterEventType, DagsterRunStatus, RunsFilter
from dagster._core.test_utils import create_run_for_test
from sqlalchemy import update

from bench.recovery_bench import drop_db, scratch_db, start
from recovery_pipelines.devserver import wait_for
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import ItemCheckpoint, PipelineLimits
from recovery_ext._store.schema import pipelines
from recovery_ext._store.store import RecoveryStore

JOB = "items_job_inprocess"  # one process per run (no step processes): N runs fit on 2 cores
NODES = ("n1", "n2", "n3", "n4")
# short remaining work: the figure is recovery, not the job's own duration
CONFIG = {"ops": {n: {"config": {"items": 2, "item_seconds": 0.01}} for n in NODES}}
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def seed_crashed(store: RecoveryStore, instance, count: int) -> list[int]:
    """``count`` pipelines as a host loss mid-n2 leaves them, each with its first run STARTED in Dagster."""
    ids = []
    for _ in range(count):
        first = create_run_for_test(instance, job_name=JOB, run_config=CONFIG, status=DagsterRunStatus.STARTED)
        own = store.pipelines.create_pipeline(JOB, list(NODES), owner=first.run_id, origin_run_id=first.run_id,
                                    params=CONFIG, limits=PipelineLimits(heartbeat_timeout=3600))
        store.pipelines.start_node(own, "n1")
        store.pipelines.complete_node(own, "n1", {"node": "n1", "items": []})
        store.pipelines.start_node(own, "n2")
        store.pipelines.start_items(own, "n2", 2)
        store.pipelines.checkpoint_item(own, "n2", ItemCheckpoint("n2-0", {"item": "n2-0", "run": first.run_id}))
        ids.append(own.pipeline_id)
    return ids


def running_since(instance, run_id: str, pipeline_id: int) -> float | None:
    """When this resume run was both STARTED and the owner of ``pipeline_id`` (None: never both)."""
    started = attached = None
    for record in instance.all_logs(run_id):
        if record.dagster_event and record.dagster_event.event_type == DagsterEventType.RUN_START:
            started = record.timestamp
        elif f"attached to pipeline {pipeline_id} as resume #1" in (record.user_message or ""):
            attached = record.timestamp
    return max(started, attached) if started and attached else None


def running_again(count: int, concurrency: int, timeout: float = 1800) -> dict:
    """Seconds from t0 until all ``count`` orphaned pipelines are running again (module docstring)."""
    app_url, dagster_url = scratch_db(), scratch_db()
    root = Path(tempfile.mkdtemp(prefix="rx-again-"))
    storage = dagster_url.replace("postgresql://", "postgresql+psycopg2://", 1)  # dagster-postgres is psycopg2
    store = RecoveryStore(app_url)
    store.migrate()
    # heartbeat timeout well above a loaded machine's pauses: a false orphan would mean a second resume
    env = {"RECOVERY_DATABASE_URL": app_url, "E2E_SENSOR_INTERVAL": "1", "E2E_HEARTBEAT_INTERVAL": "1",
           "E2E_HEARTBEAT_TIMEOUT": "20", "E2E_STALL_TIMEOUT": "60", "E2E_LAUNCH_GRACE": "60"}
    dev = start(env, root / "home", f"storage:\n  postgres:\n    postgres_url: {storage}\n"
                                    f"run_queue:\n  max_concurrent_runs: {concurrency}\n")
    try:
        ids = seed_crashed(store, dev.instance, count)
        with store.write() as conn:
            conn.execute(update(pipelines).where(pipelines.c.id.in_(ids))
                         .values(heartbeat_deadline=store.dialect.now_plus(-1)))
        t0 = time.time()
        resumes = lambda: dev.instance.get_runs(filters=RunsFilter(tags={TAG_RESUME_NUMBER: "1"}))  # noqa: E731
        wait_for(lambda: (runs := resumes()) and len(runs) >= count and all(r.status in FINISHED for r in runs),
                 timeout=timeout, interval=2.0, what=f"{count} resume runs to finish")
        time.sleep(3)  # a few more sensor ticks: a duplicate resume would show up now
        return outcome(dev.instance, store, ids, t0) | {"count": count, "concurrency": concurrency, "job": JOB}
    finally:
        dev.stop()
        store.close()
        drop_db(app_url)
        drop_db(dagster_url)


def outcome(instance, store: RecoveryStore, ids: list[int], t0: float) -> dict:
    """Check every pipeline ran again exactly once, then time it; raise on anything else."""
    runs = [r for r in instance.get_run_records(filters=RunsFilter(tags={TAG_PIPELINE: [str(i) for i in ids]}))
            if TAG_RESUME_NUMBER in r.dagster_run.tags]
    by_pipeline: dict[int, list] = {}
    for record in runs:
        by_pipeline.setdefault(int(record.dagster_run.tags[TAG_PIPELINE]), []).append(record)
    problems = [f"pipeline {i}: {len(by_pipeline.get(i, []))} resume runs" for i in ids
                if len(by_pipeline.get(i, [])) != 1]
    running, created, ended = [], [], []
    for pipeline_id, (record,) in ((p, rs) for p, rs in by_pipeline.items() if len(rs) == 1):
        run = record.dagster_run
        pipeline = store.pipelines.get_pipeline(pipeline_id)
        since = running_since(instance, run.run_id, pipeline_id)
        if (run.status != DagsterRunStatus.SUCCESS or since is None or pipeline.status != "completed"
                or pipeline.owner != run.run_id or pipeline.resume_count != 1):
            problems.append(f"pipeline {pipeline_id}: run {run.run_id} {run.status.value}, running since {since}, "
                            f"pipeline {pipeline.status} owner {pipeline.owner} resume #{pipeline.resume_count}")
            continue
        running.append(since - t0)
        created.append(record.create_timestamp.timestamp() - t0)
        ended.append((record.end_time or 0) - t0)
    if problems:
        raise AssertionError(f"{len(problems)} of {len(ids)} pipelines did not run again exactly once: "
                             + "; ".join(problems[:10]))
    return {"all_running_again_seconds": max(running), "median_running_again_seconds": statistics.median(running),
            "first_running_again_seconds": min(running), "all_created_seconds": max(created),
            "first_created_seconds": min(created), "all_finished_seconds": max(ended)}
