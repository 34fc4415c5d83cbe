"""``recovery-ext demo kill RUN_ID`` kills only the run's own worker: the pid comes from Dagster's own
process-start event (written by that process, its pid in the event's data), and the process must be
proven that run's worker before the kill -9. Real processes, a real Dagster instance on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, DagsterRunStatus, job, op
from dagster._core.events import EngineEventData

from recovery_ext._cli import main
from recovery_pipelines.devserver import process_alive, wait_for
from recovery_pipelines.run_worker import announced_pid

# A stand-in run worker: announces itself in its run's log as Dagster's run worker does, then waits.
# Its command line is "python -c ... dagster api execute_run <run id it names>"; it announces itself in the
# log of the run $ANNOUNCE_FOR_RUN.
ANNOUNCE = textwrap.dedent("""
    import os, sys, time
    from dagster import DagsterInstance
    from dagster._core.events import EngineEventData
    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(os.environ["ANNOUNCE_FOR_RUN"])
        instance.report_engine_event(f"Started process for run (pid: {os.getpid()}).", run,
                                     EngineEventData.in_process(os.getpid()))
    print("announced", flush=True)
    time.sleep(300)
""")


@op
def noop():
    return 1


@job
def some_job():
    noop()


@pytest.fixture
def home(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text("")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.get() as instance:
        yield instance


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _started_run(instance):
    return instance.create_run_for_job(some_job, status=DagsterRunStatus.STARTED)


def _worker(processes, run_id, named_run):
    proc = subprocess.Popen([sys.executable, "-c", ANNOUNCE, "dagster", "api", "execute_run", named_run],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "ANNOUNCE_FOR_RUN": run_id})
    processes.append(proc)
    assert proc.stdout.readline().strip() == "announced"
    return proc


def kill(run_id):
    return CliRunner().invoke(main, ["demo", "kill", run_id])


def test_a_pid_quoted_by_another_event_or_reported_by_another_process_is_never_killed(home, processes):
    run = _started_run(home)
    bystander = subprocess.Popen(["sleep", "300"])
    processes.append(bystander)
    # A provider's 503 text quoted in the project's own outage event is not Dagster's process-start event.
    home.report_engine_event(f"waiting out a provider outage: 503 said 'Started process for run (pid: "
                             f"{bystander.pid}).'", run, EngineEventData(metadata={"pid": str(bystander.pid)}))
    assert announced_pid(home, run.run_id) is None
    result = kill(run.run_id)
    assert result.exit_code == 1 and "has not started its run worker yet" in result.output
    # Even an event shaped exactly like Dagster's names no run worker unless the process proves to be one.
    home.report_engine_event(f"Started process for run (pid: {bystander.pid}).", run,
                             EngineEventData.in_process(bystander.pid))
    assert announced_pid(home, run.run_id)[0] == bystander.pid
    result = kill(run.run_id)
    assert result.exit_code == 1 and "is not that run's worker" in result.output
    assert process_alive(bystander.pid)


def test_a_process_that_is_another_runs_worker_is_not_killed(home, processes):
    run, other = _started_run(home), _started_run(home)
    impostor = _worker(processes, run.run_id, named_run=other.run_id)
    assert announced_pid(home, run.run_id)[0] == impostor.pid
    result = kill(run.run_id)
    assert result.exit_code == 1 and "is not that run's worker" in result.output
    assert process_alive(impostor.pid)


def test_the_runs_own_worker_is_killed(home, processes):
    run = _started_run(home)
    worker = _worker(processes, run.run_id, named_run=run.run_id)
    result = kill(run.run_id)
    assert result.exit_code == 0, result.output
    assert f"kill -9 run worker pid {worker.pid}" in result.output
    wait_for(lambda: worker.poll() is not None, timeout=10, what="the run worker to die")
    assert worker.returncode == -9
