"""Never pay twice: kill -9 a run at a random point of a multi-call item and resume it (SQLite and PostgreSQL,
a stand-in OpenAI-compatible provider counting every request). Answers that arrived are replayed from the
journal; only the call in flight at the kill is paid again, and the ledger says so: its calls equal the
provider's, the replayed ones are saved, the one in flight shows as in flight at the crash."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from dagster import DagsterInstance
from journal_defs import CALLS_PER_ITEM, journal_job
from ledger_defs import llm_resource, recovery_resource
from stand_in_llm import StandInProvider

from recovery_ext import execute_in_process
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan
from recovery_pipelines.devserver import wait_for
from helpers import reclaim_until_taken
import store_rows

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parents[1] / "support"
ITEMS = 4
CALLS = ITEMS * CALLS_PER_ITEM


def start_run(db_url: str, llm_url: str, config: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]),
           "RECOVERY_DATABASE_URL": db_url, "LEDGER_LLM_URL": llm_url}
    run_config = {"ops": {"enrich": {"config": {"items": ITEMS, **config}}}}
    return subprocess.Popen([sys.executable, str(HERE / "journal_run.py"), "journal_defs", json.dumps(run_config)],
                            cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reclaim_and_resume(store, db_url: str, llm_url: str):
    (pipeline,) = store.reports.list_pipelines()
    (reclaimed,) = reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]))
    tags = {TAG_PIPELINE: str(reclaimed.pipeline_id), TAG_RESUME_NUMBER: str(reclaimed.resume_number),
            TAG_RESUMED_FROM: reclaimed.previous_owner}
    os.environ["RECOVERY_DATABASE_URL"] = db_url
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(journal_job, instance=instance, tags=tags,
                                    run_config={"ops": {"enrich": {"config": {"items": ITEMS}}}},
                                    resources={"recovery": recovery_resource(), "llm": llm_resource(llm_url)})
    assert result.success
    return pipeline.id


def asked_twice(provider: StandInProvider) -> int:
    """Requests the provider answered more than once (same item, same question)."""
    return sum(n - 1 for n in Counter((c.item, c.tokens_in) for c in provider.calls).values())


def test_a_kill_after_answers_arrived_pays_none_of_them_again(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    kill_after = random.Random().randint(1, CALLS - 1)
    with StandInProvider() as provider:
        worker = start_run(db_url, provider.url, {"kill_after_calls": kill_after})
        assert worker.wait(240) == -signal.SIGKILL, "the run should have killed itself"
        assert len(provider.calls) == kill_after
        pipeline_id = reclaim_and_resume(store, db_url, provider.url)
        assert len(provider.calls) == CALLS, f"killed after call {kill_after}: requests were sent again"
    assert asked_twice(provider) == 0
    f = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    counted = provider.totals()
    assert (f.calls, f.tokens_in, f.tokens_out) == (counted["calls"], counted["tokens_in"], counted["tokens_out"])
    checkpointed_before = (kill_after - 1) // CALLS_PER_ITEM * CALLS_PER_ITEM
    assert (f.saved_calls, f.replayed_calls) == (kill_after, kill_after - checkpointed_before)
    assert (f.wasted_calls, f.in_flight_unknown_calls) == (0, 0)
    assert store_rows.call_journal_size(store, pipeline_id) == (0, 0)  # the pipeline completed: pruned


def test_a_kill_mid_call_pays_only_the_call_in_flight_again(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    kill_at = random.Random().randint(1, CALLS)
    with StandInProvider(latency=1.0) as provider:
        worker = start_run(db_url, provider.url, {})
        try:
            # the kill_at-th request reached the provider, which answers in 1 s: it is in flight
            wait_for(lambda: len(provider.calls) >= kill_at, timeout=240, interval=0.02, what="the request")
            worker.send_signal(signal.SIGKILL)
        finally:
            worker.wait(30)
        assert len(provider.calls) == kill_at
        in_flight = provider.calls[-1]
        provider.latency = 0.0
        pipeline_id = reclaim_and_resume(store, db_url, provider.url)
        assert len(provider.calls) == CALLS + 1, f"killed at call {kill_at}"
    assert asked_twice(provider) == 1  # exactly the call in flight at the kill
    f = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    counted = provider.totals()
    assert f.calls == counted["calls"]
    # the one call whose answer never arrived: the ledger knows it was sent, not what it cost
    assert (f.tokens_in, f.tokens_out) == (counted["tokens_in"] - in_flight.tokens_in,
                                           counted["tokens_out"] - in_flight.tokens_out)
    assert (f.in_flight_unknown_calls, f.wasted_calls) == (1, 0)
    checkpointed_before = (kill_at - 1) // CALLS_PER_ITEM * CALLS_PER_ITEM
    assert (f.saved_calls, f.replayed_calls) == (kill_at - 1, kill_at - 1 - checkpointed_before)
