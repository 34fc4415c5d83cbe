"""Spend caps across processes, kills and an operator's raise, on SQLite and PostgreSQL, against the stand-in
LLM (a real HTTP server; its own count of tokens is the truth):

* four processes under one cap stop at it: the stand-in counted at most the cap plus one request's estimate
  per process (here not even that: each estimate bounds its call from above);
* a process killed -9 while it holds a reservation at the cap leaves it counted: nobody else gets its room;
* a pipeline paused at its cap (waiting, reason "spend cap", never failed) goes on once an operator raises the
  cap with `recovery-ext spend-cap set`, and completes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, in_process_executor

from ledger_defs import llm_resource, make_ledger_job, recovery_resource
from recovery_ext import execute_in_process
from recovery_ext._cli import main
from recovery_ext._store.models import SpendCaps, pipeline_scope
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.devserver import wait_for
from stand_in_llm import StandInProvider

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parents[1] / "support"
PROCESSES = 4
CAP = 4000  # tokens: about 25 calls of the stand-in's, about 15 of their estimates


def worker(db_url: str, own, llm_url: str, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])])}
    return subprocess.Popen([sys.executable, str(HERE / "spend_worker.py"), db_url, str(own.pipeline_id),
                             str(own.epoch), own.owner, llm_url, str(CAP), mode],
                            cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_four_processes_under_one_cap_overshoot_it_by_at_most_one_estimate_each(store, db_url):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    with StandInProvider() as provider:
        procs = [worker(db_url, own, provider.url, "calls") for _ in range(PROCESSES)]
        outputs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(r["reason"].startswith(f"{pipeline_scope(own.pipeline_id)}: ") for r in reports)  # paused by the cap
    answered = provider.answered()
    spent = sum(c.tokens_in + c.tokens_out for c in answered)
    assert len(answered) == sum(r["asked"] for r in reports)
    assert sum(r["asked"] > 0 for r in reports) >= 2  # they ran side by side, not one after the other
    estimate = max(r["estimate"] for r in reports)
    assert spent <= CAP + PROCESSES * estimate
    assert spent <= CAP  # each estimate bounds its call: the cap itself holds
    cap = store.providers.spend_cap(pipeline_scope(own.pipeline_id))
    # the cap counted what the provider did (each answer's usage settled its reservation), and it was reached
    assert (cap.spent_tokens, cap.reserved_tokens) == (spent, 0)
    assert cap.left_tokens < estimate


def test_a_kill_at_the_cap_loses_no_reservation(store, db_url):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    scope = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=CAP))[0]
    taken = store.providers.spend_reserve(own, [scope], tokens=CAP - 1000)  # the cap's room but 1000 tokens
    assert taken.granted
    holder = worker(db_url, own, "http://127.0.0.1:9", "hold")
    try:
        line = holder.stdout.readline()
        assert json.loads(line)["held"], holder.stderr.read()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
    cap = store.providers.spend_cap(scope)
    assert (cap.reserved_tokens, cap.left_tokens) == (CAP, 0)  # the dead process's 1000 stay counted
    assert not store.providers.spend_reserve(own, [scope], tokens=1).granted
    # the live reservation's usage settles it; the dead one's stays
    store.providers.spend_settle(taken.reservations, tokens=CAP - 1000, cost=None)
    cap = store.providers.spend_cap(scope)
    assert (cap.spent_tokens, cap.reserved_tokens) == (CAP - 1000, 1000)


def test_raising_the_cap_resumes_a_paused_pipeline(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    results: list = []
    job = make_ledger_job(in_process_executor)
    with StandInProvider() as provider, DagsterInstance.ephemeral() as instance:
        llm = llm_resource(provider.url, max_tokens=64)
        resource = recovery_resource(spend_cap_tokens=600, spend_cap_poll_seconds=0.2)
        runner = threading.Thread(target=lambda: results.append(execute_in_process(
            job, instance=instance, run_config={"ops": {"ask": {"config": {"items": 6}}}},
            resources={"recovery": resource, "llm": llm}, raise_on_error=False)))
        runner.start()
        try:
            def paused():
                found = store.reports.list_pipelines()
                return found and found[0].shown_status == WAITING and found[0].waiting_reason.startswith("spend cap")

            wait_for(paused, timeout=120, interval=0.05, what="the pipeline to pause at its spend cap")
            (pipeline,) = store.reports.list_pipelines()
            asked_before = len(provider.answered())
            status = CliRunner().invoke(main, ["--database-url", db_url, "status"])
            assert "Paused at a spend cap: 1" in status.output
            assert f"pipeline {pipeline.id} (ledger_job) waiting, next check" in status.output
            raised = CliRunner().invoke(main, ["--database-url", db_url, "spend-cap", "set", "--pipeline",
                                               str(pipeline.id), "--tokens", "100000"])
            assert raised.exit_code == 0, raised.output
        finally:
            runner.join(120)
        assert not runner.is_alive() and results and results[0].success
        assert len(provider.answered()) > asked_before  # it went on after the raise
    done = store.pipelines.get_pipeline(pipeline.id)
    assert (done.status, done.epoch, done.resume_count) == ("completed", 1, 0)  # never failed, never taken over
    events = [t["event"] for t in store.reports.transitions_for(pipeline_id=pipeline.id)]
    assert "spend_cap_wait" in events and "spend_cap_room" in events
    cap = store.providers.spend_cap(pipeline_scope(pipeline.id))
    assert (cap.max_tokens, cap.changed_by, cap.reserved_tokens) == (100000, "operator (recovery-ext)", 0)
    total = store.reports.provider_costs(pipeline.id).total
    assert cap.spent_tokens == total.tokens_in + total.tokens_out  # the cap and the ledger agree
    costs = CliRunner().invoke(main, ["--database-url", db_url, "--json", "costs", str(pipeline.id)])
    (shown,) = json.loads(costs.output)["spend_caps"]
    assert shown["left_tokens"] == 100000 - cap.spent_tokens
    report = json.loads(CliRunner().invoke(main, ["--database-url", db_url, "--json", "report",
                                                  str(pipeline.id)]).output)
    assert report["spend_caps"] == [shown] and set(report["waited_on"]) == {"spend cap"}


def test_an_interrupt_stops_an_async_node_whose_tasks_wait_at_the_cap(store, db_url):
    """32 SDK tasks of an ``async def`` node, most waiting at a 300-token cap: Dagster's interrupt (SIGINT to the
    run worker) ends the run. A wait at the cap holds no worker thread, so the event loop's shutdown has none to
    wait for (six tasks waiting in the loop's six threads kept a terminated step process alive for minutes). What
    the run held stays counted, as after a kill, until a take-over settles it."""
    from sdk_stand_in import SdkStandIn

    stand_in = SdkStandIn(latency=0.1)
    url = stand_in.start() + "/v1"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]),
           "RECOVERY_DATABASE_URL": db_url, "PARALLEL_URL": url}
    run_config = {"ops": {"sdk_tasks": {"config": {"keys": 60, "concurrency": 32, "max_tokens": 100}}}}
    settings = {"spend_cap_tokens": 300, "spend_cap_poll_seconds": 0.5}
    worker = subprocess.Popen([sys.executable, str(HERE / "parallel_run.py"), "sdk_tasks_job", json.dumps(run_config),
                               json.dumps(settings)], cwd=HERE, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        def paused():
            found = store.reports.list_pipelines()
            return found and found[0].shown_status == WAITING and found[0].waiting_reason.startswith("spend cap")

        wait_for(paused, timeout=120, interval=0.05, what="the pipeline to pause at its spend cap")
        worker.send_signal(signal.SIGINT)
        out, _ = worker.communicate(timeout=60)  # not a wait for ever
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
        stand_in.stop()
    assert json.loads(out.strip().splitlines()[-1])["success"] is False  # interrupted
    (pipeline,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(pipeline.id).status == "running"  # for the orphan sensor to take over
    cap = store.providers.spend_cap(pipeline_scope(pipeline.id))
    assert cap.spent_tokens + cap.reserved_tokens <= 300
