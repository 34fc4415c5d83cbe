"""The UI shows recovery: checked through the webserver's GraphQL API under a real `dagster dev`.

* a run waiting out a provider outage carries `recovery/state=waiting` and an engine event with the
  reason and the next try; both clear ("waiting over", `recovery/state=running`) when it goes on;
* `recovery-ext demo kill RUN_ID` kills a running run's worker (kill -9), the run fails, and a
  re-execution from failure (the UI's button, the same GraphQL mutation) takes the pipeline over:
  its log carries the takeover engine event and the application tables a `pipeline_taken_over` event.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recovery_ext import RecoveryStore
from recovery_pipelines.devserver import DagsterDev, cmdline, parent_of, process_alive, wait_for
from recovery_pipelines.run_worker import find_run_worker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = """query($runId: ID!) { runOrError(runId: $runId) { __typename
  ... on Run { status tags { key value } } } }"""
LOGS = """query($runId: ID!) { logsForRun(runId: $runId) { __typename
  ... on EventConnection { events { __typename ... on MessageEvent { message } } } } }"""
REEXECUTE = """mutation($parent: String!) { launchRunReexecution(reexecutionParams:
  {parentRunId: $parent, strategy: FROM_FAILURE}) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory, cpu_hog_module):
    home = tmp_path_factory.mktemp("dagster_home")
    app_url = f"sqlite:///{home / 'recovery.sqlite3'}"
    server = DagsterDev(
        (Path(__file__).resolve().parents[1] / "support" / "ui_defs.py"), home, {"RECOVERY_DATABASE_URL": app_url}
    )
    server.start(timeout=240)
    store = RecoveryStore(app_url)
    yield server, store
    store.close()
    server.stop()


def graphql(dev: DagsterDev, query: str, **variables):
    return dev.client._execute(query, variables)


def tags_of(dev: DagsterDev, run_id: str) -> dict[str, str]:
    run = graphql(dev, RUN, runId=run_id)["runOrError"]
    return {t["key"]: t["value"] for t in run.get("tags") or []}


def messages_of(dev: DagsterDev, run_id: str) -> list[str]:
    logs = graphql(dev, LOGS, runId=run_id)["logsForRun"]
    return [e.get("message") or "" for e in logs.get("events") or []]


def status_of(dev: DagsterDev, run_id: str) -> str:
    return graphql(dev, RUN, runId=run_id)["runOrError"]["status"]


def test_a_waiting_run_shows_its_state_and_the_next_try_then_running(ui):
    dev, _ = ui
    run_id = dev.launch("waiting_job", {})
    wait_for(lambda: tags_of(dev, run_id).get("recovery/state") == "waiting", timeout=120,
             what="the run to show recovery/state=waiting")
    waiting = [m for m in messages_of(dev, run_id) if "waiting out a provider outage" in m]
    assert waiting and "next try at" in waiting[0] and "timeout errors in a row in flaky_provider" in waiting[0]
    wait_for(lambda: status_of(dev, run_id) == "SUCCESS", timeout=120, what="the run to succeed")
    assert tags_of(dev, run_id)["recovery/state"] == "running"
    messages = messages_of(dev, run_id)
    assert sum("waiting out a provider outage in flaky_provider" in m for m in messages) == 2
    assert sum("waiting over in flaky_provider" in m for m in messages) == 2


def test_demo_kill_crashes_the_run_and_a_re_execution_takes_the_pipeline_over(ui):
    dev, store = ui
    run_id = dev.launch("slow_job", {})
    pipeline = wait_for(lambda: store.pipelines.find_pipeline(run_id), timeout=120, what="the pipeline of the run")
    wait_for(lambda: len(store.pipelines.completed_items(pipeline.id, "slow_items")) >= 3, timeout=120,
             what="a few items done")
    # what the README says about finding the pid: the run announced it, and it is a multiprocessing
    # child of the code server whose command line names no run
    worker = find_run_worker(dev.instance, run_id)
    assert "multiprocessing" in worker.command and run_id not in worker.command
    assert "dagster api grpc" in cmdline(parent_of(worker.pid))
    env = {**os.environ, "DAGSTER_HOME": str(dev.home)}
    killed = subprocess.run([sys.executable, "-m", "recovery_ext._cli", "demo", "kill", run_id], env=env,
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 0, killed.stderr
    pid = int(killed.stdout.split("pid ")[1].split()[0])
    assert pid == worker.pid
    wait_for(lambda: not process_alive(pid), timeout=30, what="the run worker to die")
    wait_for(lambda: status_of(dev, run_id) == "FAILURE", timeout=60, what="the killed run to fail")
    kept = len(store.pipelines.completed_items(pipeline.id, "slow_items"))
    again = subprocess.run([sys.executable, "-m", "recovery_ext._cli", "demo", "kill", run_id], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "is FAILURE, not running" in again.stderr  # one clear line, nothing killed

    launched = graphql(dev, REEXECUTE, parent=run_id)["launchRunReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    new_run = launched["run"]["runId"]
    wait_for(lambda: status_of(dev, new_run) == "SUCCESS", timeout=120, what="the re-execution to succeed")
    takeover = [m for m in messages_of(dev, new_run) if "took over pipeline" in m]
    assert takeover and f"from run {run_id} as a re-execution of {run_id}" in takeover[0]
    assert "its run is FAILURE or CANCELED in Dagster" in takeover[0]
    (event,) = store.reports.recent_events(kinds=("pipeline_taken_over",))
    assert (event["pipeline_id"], event["payload"]["owner"], event["payload"]["cause"]) == (
        pipeline.id, new_run, "owner_run_dead")
    assert store.pipelines.get_pipeline(pipeline.id).status == "completed"
    assert sum(1 for _ in store.pipelines.completed_items(pipeline.id, "slow_items")) == 30 and kept >= 3
