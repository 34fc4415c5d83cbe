"""kill -9 a run worker with 64 calls in flight (ctx.map threads and ctx.amap tasks, SQLite and PostgreSQL), then
resume it: only the unfinished items are redone, the provider is paid again only for the calls in flight at the
kill (the ledger's in-flight rows), and the ledger matches what the stand-in counted, item by item."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from dagster import DagsterInstance
from ledger_defs import recovery_resource

import parallel_defs
import store_rows
from echo_provider import EchoProvider
from helpers import reclaim_until_taken
from recovery_ext import execute_in_process
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan
from recovery_pipelines.devserver import wait_for

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parents[1] / "support"
ITEMS = 192
CONCURRENCY = 64


def start_run(db_url: str, url: str, job: str, node: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]),
           "RECOVERY_DATABASE_URL": db_url, "PARALLEL_URL": url}
    run_config = {"ops": {node: {"config": {"keys": ITEMS, "concurrency": CONCURRENCY}}}}
    return subprocess.Popen([sys.executable, str(HERE / "parallel_run.py"), job, json.dumps(run_config)],
                            cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("job, node", [("threaded_job", "threaded"), ("tasks_job", "tasks")])
def test_a_kill_with_64_calls_in_flight_pays_again_only_for_those(store, db_url, monkeypatch, job, node):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    with EchoProvider(latency=3.0) as provider:
        worker = start_run(db_url, provider.url, job, node)
        try:
            # answers arrived (some checkpointed) and the window is (nearly) full of calls in flight: kill now
            wait_for(lambda: sum(provider.paid.values()) >= CONCURRENCY // 2 and provider.in_flight >= CONCURRENCY - 8,
                     timeout=240, interval=0.02, what="a full window of calls in flight")
            in_flight_seen = provider.in_flight
            worker.send_signal(signal.SIGKILL)
        finally:
            worker.wait(30)
        wait_for(lambda: provider.in_flight == 0, timeout=30, what="the provider to answer what it had")
        (pipeline,) = store.reports.list_pipelines()
        checkpointed_before = set(store.pipelines.completed_items(pipeline.id, node))
        first_rows = store_rows.provider_calls(store, pipeline.id)
        in_flight_at_kill = {c.item_key for c in first_rows if c.outcome == "in_flight"}
        assert len(in_flight_at_kill) >= in_flight_seen  # every call the provider held is in flight in the ledger
        assert 0 < len(checkpointed_before) < ITEMS
        arrivals_before = len(provider.arrivals)

        provider.latency = 0.0
        (reclaimed,) = reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]))
        tags = {TAG_PIPELINE: str(pipeline.id), TAG_RESUME_NUMBER: str(reclaimed.resume_number),
                TAG_RESUMED_FROM: reclaimed.previous_owner}
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(getattr(parallel_defs, job), instance=instance, tags=tags,
                                        run_config={"ops": {node: {"config": {"url": provider.url, "keys": ITEMS,
                                                                              "concurrency": CONCURRENCY}}}},
                                        resources={"recovery": recovery_resource()})
        assert result.success

    keys = parallel_defs.keys_of(parallel_defs.ParallelConfig(keys=ITEMS))
    results = store.pipelines.completed_items(pipeline.id, node)
    assert results == {k: {"key": k, "answer": f"answer-{k}", "asked_for": k} for k in keys}
    resumed_asks = {item for _, item in provider.arrivals[arrivals_before:]}
    assert not resumed_asks & checkpointed_before  # finished items are never redone
    paid_twice = {item for item, n in provider.paid.items() if n > 1}
    sent_before = {item for _, item in provider.arrivals[:arrivals_before]}
    # only the calls in flight at the kill were paid again (an in-flight row whose request the kill stopped
    # before it left was never paid the first time)
    assert paid_twice == in_flight_at_kill & sent_before
    assert all(n <= 2 for n in provider.paid.values())
    rows = Counter(c.item_key for c in store_rows.provider_calls(store, pipeline.id))
    arrived = Counter(item for _, item in provider.arrivals)
    for key in keys:  # the ledger holds every request the provider saw, item by item; an extra row can only be
        # an in-flight row whose request the kill stopped before it left
        assert arrived[key] <= rows[key] <= arrived[key] + (key in in_flight_at_kill), key
    assert sum(provider.paid.values()) == sum(arrived.values())
