"""A run in this process (`python my_job.py`, `execute_in_process`) belongs to a stable deployment.

Dagster's own `execute_in_process` runs on a throw-away instance; a pipeline named after it would be
stranded by a crash, since no sensor serves that name. Here it belongs to the deployment of the
instance under DAGSTER_HOME (or the one named), so the orphan sensor of that instance resumes it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context
from sqlalchemy import text


from recovery_ext import RecoveryResource, execute_in_process, make_orphan_sensor
from recovery_ext._dagster.resources import derived_deployment
from recovery_ext._store.models import IN_PROCESS_DEPLOYMENT
from recovery_pipelines.devserver import wait_for

ROOT = Path(__file__).resolve().parents[2]
ITEMS = 20

# What a user saves as my_job.py: one op that works through 20 items, checkpointing each.
MY_JOB = f'''
import os
import time

from recovery_ext import RecoveryResource, execute_in_process, recoverable_job, recoverable_op


@recoverable_op
def summarise(ctx):
    for item in ctx.items(f"doc-{{n}}" for n in range({ITEMS})):
        time.sleep(float(os.environ.get("ITEM_SECONDS", "0")))
        item.complete(item.key.upper())
    return len(ctx.completed_items())


@recoverable_job
def my_pipeline():
    summarise()


RECOVERY = RecoveryResource(heartbeat_interval=0.5, heartbeat_timeout=2)

if __name__ == "__main__":
    print(execute_in_process(my_pipeline, resources={{"recovery": RECOVERY}}).output_for_node("summarise"))
'''


@pytest.fixture
def my_job(tmp_path):
    path = tmp_path / "my_job.py"
    path.write_text(MY_JOB)
    spec = importlib.util.spec_from_file_location("my_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


@pytest.fixture
def home(tmp_path, monkeypatch):
    folder = tmp_path / "dagster_home"
    folder.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(folder))
    monkeypatch.delenv("RECOVERY_DEPLOYMENT", raising=False)
    return folder


def home_deployment() -> str:
    instance = DagsterInstance.get()
    try:
        return derived_deployment(instance)
    finally:
        instance.dispose()


def items_done(store, pipeline_id: int, *, epoch: int | None = None) -> int:
    query = "SELECT count(*) FROM rx_node_items WHERE pipeline_id = :p" + (" AND epoch = :e" if epoch else "")
    with store.read() as conn:
        return conn.execute(text(query), {"p": pipeline_id, "e": epoch}).scalar() or 0


def status(db_url: str) -> str:
    done = subprocess.run([str(Path(sys.executable).parent / "recovery-ext"), "--database-url", db_url, "status"],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_status_says_an_orphan_of_a_run_without_dagster_home_is_resumed_by_no_sensor(store, db_url):
    from helpers import expire

    own = store.pipelines.create_pipeline("my_pipeline", ["summarise"], owner="run-1", origin_run_id="run-1",
                                deployment=IN_PROCESS_DEPLOYMENT)
    expire(store, own.pipeline_id)
    out = status(db_url)
    assert f"pipeline {own.pipeline_id} (my_pipeline)" in out
    assert "no Dagster instance (no DAGSTER_HOME): no orphan sensor resumes it" in out


def test_in_process_runs_belong_to_dagster_homes_deployment_or_the_named_one(store, db_url, my_job, home,
                                                                             monkeypatch):
    _, module = my_job
    for _ in range(2):
        execute_in_process(module.my_pipeline, resources={"recovery": RecoveryResource(database_url=db_url)})
    named = home_deployment()
    assert named.startswith("dagster-")
    assert [p.deployment for p in store.reports.list_pipelines()] == [named, named]
    execute_in_process(module.my_pipeline,
                       resources={"recovery": RecoveryResource(database_url=db_url, deployment="blue")})
    monkeypatch.setenv("RECOVERY_DEPLOYMENT", "green")
    execute_in_process(module.my_pipeline, resources={"recovery": RecoveryResource(database_url=db_url)})
    monkeypatch.delenv("RECOVERY_DEPLOYMENT")
    monkeypatch.delenv("DAGSTER_HOME")
    execute_in_process(module.my_pipeline, resources={"recovery": RecoveryResource(database_url=db_url)})
    deployments = sorted(p.deployment for p in store.reports.list_pipelines())
    assert deployments == sorted([named, named, "blue", "green", IN_PROCESS_DEPLOYMENT])


@pytest.mark.timeout(240)
def test_a_killed_python_my_job_py_is_resumed_by_the_orphan_sensor_of_the_same_dagster_home(store, db_url, my_job,
                                                                                           home):
    path, module = my_job
    env = {**os.environ, "RECOVERY_DATABASE_URL": db_url, "ITEM_SECONDS": "0.3", "DAGSTER_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, str(path)], cwd=path.parent, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        pipeline = wait_for(lambda: next(iter(store.reports.list_pipelines()), None), timeout=120, what="the pipeline")
        wait_for(lambda: items_done(store, pipeline.id) >= 7, timeout=120, what="7 of 20 items done")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done_at_kill = items_done(store, pipeline.id)
    assert done_at_kill < ITEMS and store.pipelines.get_pipeline(pipeline.id).status == "running"
    # once its heartbeat expired, `status` says who resumes it
    where = f"resumed by the orphan sensor of deployment {home_deployment()}"
    wait_for(lambda: where in status(db_url), timeout=30, what="status to name the orphan's deployment")

    # `dagster dev -f my_job.py` with the same DAGSTER_HOME: its daemon ticks the orphan sensor
    sensor = make_orphan_sensor([module.my_pipeline], minimum_interval_seconds=5)
    instance = DagsterInstance.get()
    try:
        def tick():
            context = build_sensor_context(instance=instance,
                                           resources={"recovery": RecoveryResource(database_url=db_url)})
            return sensor.evaluate_tick(context).run_requests

        (request,) = wait_for(tick, timeout=60, interval=0.5, what="the orphan sensor to reclaim the dead run")
        result = execute_in_process(module.my_pipeline, instance=instance, tags=request.tags,
                                    run_config=request.run_config,
                                    resources={"recovery": RecoveryResource(database_url=db_url)})
    finally:
        instance.dispose()
    assert result.output_for_node("summarise") == ITEMS
    (only,) = store.reports.list_pipelines()  # resumed, not started again
    assert only.id == pipeline.id and only.status == "completed" and only.epoch == 2
    # the resume did only what the killed run had not finished
    assert items_done(store, pipeline.id, epoch=2) == ITEMS - done_at_kill
