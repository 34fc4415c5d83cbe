"""The ledger agrees with what a stand-in provider counted, across a kill -9 and its resume, and a step
process whose run worker was killed stops calling the provider at once (real processes, real HTTP,
SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, in_process_executor
from sqlalchemy import func, select

from ledger_defs import PRICES, llm_resource, make_ledger_job, recovery_resource
from click.testing import CliRunner

from recovery_ext import execute_in_process
from recovery_ext._cli import main
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan
from recovery_ext._store.schema import node_items
from recovery_pipelines.devserver import process_alive, wait_for
from stand_in_llm import StandInProvider
from helpers import reclaim
import store_rows

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parents[1] / "support"
ITEMS = 6


def start_run_worker(db_url: str, llm_url: str, run_config: dict, *, inprocess: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]),
           "RECOVERY_DATABASE_URL": db_url, "LEDGER_LLM_URL": llm_url}
    return subprocess.Popen([sys.executable, str(HERE / "ledger_run.py"), json.dumps(run_config),
                             *(["inprocess"] if inprocess else [])], cwd=HERE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def resume(store, db_url: str, llm_url: str, reclaimed):
    tags = {TAG_PIPELINE: str(reclaimed.pipeline_id), TAG_RESUME_NUMBER: str(reclaimed.resume_number),
            TAG_RESUMED_FROM: reclaimed.previous_owner}
    os.environ["RECOVERY_DATABASE_URL"] = db_url
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(make_ledger_job(in_process_executor), instance=instance, tags=tags,
                                    run_config={"ops": {"ask": {"config": {"items": ITEMS}}}},
                                    resources={"recovery": recovery_resource(), "llm": llm_resource(llm_url)})
        engine_events = [e.message for e in instance.all_logs(result.run_id)
                         if e.dagster_event and e.dagster_event.event_type == DagsterEventType.ENGINE_EVENT]
    return result, engine_events


def expected_cost(calls) -> float:
    price = PRICES["m"]
    return sum(c.tokens_in * price["input"] + c.tokens_out * price["output"] for c in calls) / 1_000_000


def assert_ledger_agrees_with_the_provider(store, pipeline_id: int, provider: StandInProvider):
    figures = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    counted = provider.totals()
    assert (figures.calls, figures.tokens_in, figures.tokens_out) == \
        (counted["calls"], counted["tokens_in"], counted["tokens_out"])
    assert figures.cost == pytest.approx(expected_cost(provider.calls), rel=1e-12)
    return figures


def _checkpointed(store, pipeline_id: int, *, epoch: int | None = None) -> int:
    """The items checkpointed in the pipeline (by the owner of ``epoch``)."""
    where = [node_items.c.pipeline_id == pipeline_id] + ([node_items.c.epoch == epoch] if epoch is not None else [])
    with store.read() as conn:
        return conn.scalar(select(func.count()).select_from(node_items).where(*where))


@pytest.mark.parametrize("reclaim_later", [False, True], ids=["reclaimed_mid_call", "reclaimed_later"])
def test_kill_9_of_the_run_worker_mid_call_stops_its_step_and_the_ledger_agrees(store, db_url, monkeypatch,
                                                                                reclaim_later):
    """The step process outlives its run worker. It starts no call after the kill; the answer in flight is
    kept if its checkpoint comes before the reclaim (the fence decides), else it is the one call wasted and
    paid twice."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    with StandInProvider(latency=1.5, track_pids=True) as provider:
        worker = start_run_worker(db_url, provider.url, {"ops": {"ask": {"config": {"items": ITEMS}}}})
        try:
            # two items answered and checkpointed, the third call in flight (the stand-in takes 1.5 s)
            wait_for(lambda: len(provider.calls) >= 3, timeout=240, interval=0.02, what="the third call")
            os.kill(worker.pid, signal.SIGKILL)
            killed_at = time.time()
        finally:
            worker.kill()
            worker.wait(30)
        step_pid = provider.calls[-1].pid
        assert step_pid is not None and step_pid != worker.pid  # a step process, a child of the run worker
        (pipeline,) = store.reports.list_pipelines()
        # The orphan sensor takes the pipeline over, while the old step's call is in flight, or once the old step
        # has checkpointed the item whose answer was in flight.
        if reclaim_later:
            wait_for(lambda: _checkpointed(store, pipeline.id) >= 3, timeout=60, interval=0.05,
                     what="the old step's checkpoint of the answer in flight at the kill")
        # a pass skips the pipeline while a write of the old step holds its row (FOR UPDATE SKIP LOCKED): tick again
        (reclaimed,) = wait_for(lambda: reclaim(store, PassPlan(dead_owner_runs=[pipeline.owner]))[0], timeout=30,
                                what="the take-over of the pipeline")
        wait_for(lambda: not process_alive(step_pid), timeout=60, what="the orphaned step process to stop")
        after_kill = [c for c in provider.calls if c.pid == step_pid and c.at > killed_at]
        assert after_kill == [], f"the old step called the provider {len(after_kill)} time(s) after the kill"
        first_run_calls = len(provider.calls)

        result, engine_events = resume(store, db_url, provider.url, reclaimed)
        assert result.success

    asked = {}
    for call in provider.calls:
        asked[call.item] = asked.get(call.item, 0) + 1
    paid_twice = [item for item, n in asked.items() if item.startswith("t") and n > 1]
    assert len(paid_twice) <= 1  # at most the answer in flight at the fault
    figures = assert_ledger_agrees_with_the_provider(store, pipeline.id, provider)
    kept_before = _checkpointed(store, pipeline.id, epoch=1)
    wasted = 0 if reclaim_later else 1  # the answer in flight, written by the superseded step
    assert kept_before == first_run_calls - wasted
    assert figures.saved_calls == kept_before and figures.saved_tokens > 0
    assert (figures.wasted_calls, len(paid_twice)) == (wasted, wasted)
    assert figures.calls == first_run_calls + (ITEMS - kept_before) + 1  # the resume: the rest and the summary
    ask = [e for e in result.all_events if e.step_key == "ask" and e.event_type == DagsterEventType.STEP_OUTPUT]
    metadata = ask[0].step_output_data.metadata
    assert metadata["node_provider_saved_calls"].value == kept_before
    assert metadata["node_provider_wasted_calls"].value == wasted
    assert any(f"provider calls: {figures.calls}" in m for m in engine_events)


def test_a_crash_between_items_is_saved_by_the_resume_at_its_first_cost(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    with StandInProvider() as provider:
        worker = start_run_worker(db_url, provider.url,
                                  {"ops": {"ask": {"config": {"items": ITEMS, "kill_after": 2}}}}, inprocess=True)
        assert worker.wait(240) == -signal.SIGKILL  # the run worker killed itself (-9) after two checkpoints
        (pipeline,) = store.reports.list_pipelines()
        # a pass skips the pipeline while a write of the old step holds its row (FOR UPDATE SKIP LOCKED): tick again
        (reclaimed,) = wait_for(lambda: reclaim(store, PassPlan(dead_owner_runs=[pipeline.owner]))[0], timeout=30,
                                what="the take-over of the pipeline")
        first = list(provider.calls)
        result, _ = resume(store, db_url, provider.url, reclaimed)
        assert result.success
    figures = assert_ledger_agrees_with_the_provider(store, pipeline.id, provider)
    assert (len(first), figures.calls) == (2, ITEMS + 1)
    assert (figures.saved_calls, figures.saved_tokens) == (2, sum(c.tokens_in + c.tokens_out for c in first))
    assert figures.saved_cost == pytest.approx(expected_cost(first), rel=1e-12)
    assert (figures.wasted_calls, figures.wasted_tokens, figures.wasted_cost) == (0, 0, 0.0)
    nodes = store.reports.provider_costs(pipeline.id).nodes[pipeline.id]
    assert (nodes["ask"].calls, nodes["summarize"].calls) == (ITEMS, 1)
    assert all(
        store_rows.reached_checkpoint(store, [c.id for c in store_rows.provider_calls(store, pipeline.id)]).values()
    )

    shown = json.loads(cli(db_url, "costs", str(pipeline.id), "--json"))
    assert {k: shown[k] for k in figures.as_dict()} == figures.as_dict()
    assert shown["calls"] == len(provider.calls) and shown["saved_calls"] == 2
    assert shown["nodes"]["ask"]["saved_calls"] == 2 and shown["nodes"]["summarize"]["calls"] == 1
    everything = json.loads(cli(db_url, "--json", "costs"))
    assert everything["tokens_in"] == provider.totals()["tokens_in"]
    assert [p["pipeline_id"] for p in everything["pipelines"]] == [pipeline.id]
    table = cli(db_url, "costs", str(pipeline.id))
    assert "saved calls/tokens/cost" in table and "summarize" in table
    missing = CliRunner().invoke(main, ["--database-url", db_url, "costs", "999999"])
    assert missing.exit_code == 1 and "no pipeline 999999" in missing.output and "Traceback" not in missing.output


def cli(url, *args) -> str:
    result = CliRunner().invoke(main, ["--database-url", url, *args])
    assert result.exit_code == 0, result.output
    return result.stdout
