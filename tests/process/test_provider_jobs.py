"""Provider jobs that survive crashes (SQLite and PostgreSQL), against a stand-in of OpenAI's Batch API driven
through the ``openai`` SDK: a kill -9 while the batch is pending is followed by a resume that re-attaches to
the same batch (1 submission, nothing paid twice); an expired batch is resubmitted for its unfinished items
only, and the ledger says so; every figure of the ledger equals the stand-in's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from batch_checks import assert_ledger_equals_the_provider, outcomes
from batch_defs import job
from dagster import DagsterInstance, in_process_executor
from ledger_defs import recovery_resource

from recovery_ext import execute_in_process
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.batch_stand_in import BatchProvider
from recovery_pipelines.devserver import wait_for
from helpers import reclaim_until_taken
import store_rows

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parents[1] / "support"
ITEMS = 6


def run_in_process(tags=None, poll=0.2):
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(job, instance=instance, tags=tags or {},
                                    run_config={"ops": {"describe": {"config": {"items": ITEMS,
                                                                                "poll_seconds": poll}}}},
                                    resources={"recovery": recovery_resource()})
    assert result.success
    return result


def test_a_kill_while_the_batch_is_pending_is_reattached_not_resubmitted(store, db_url, monkeypatch):
    with BatchProvider(duration=8.0) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])])}
        config = {"ops": {"describe": {"config": {"items": ITEMS, "poll_seconds": 0.2}}}}
        worker = subprocess.Popen([sys.executable, str(HERE / "journal_run.py"), "batch_defs", json.dumps(config)],
                                  cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: provider.submissions == 1, timeout=240, interval=0.05, what="the batch's submission")

            def waiting():
                found = store.reports.list_pipelines()
                return found and found[0].shown_status == WAITING and "openai-batch job" in found[0].waiting_reason

            wait_for(waiting, timeout=60, interval=0.05, what="the pipeline to show the batch wait")
            worker.send_signal(signal.SIGKILL)
        finally:
            worker.wait(30)
        assert provider.answered() == []  # killed while the batch was pending
        (pipeline,) = store.reports.list_pipelines()
        (reclaimed,) = reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]))
        result = run_in_process({TAG_PIPELINE: str(reclaimed.pipeline_id),
                                 TAG_RESUME_NUMBER: str(reclaimed.resume_number),
                                 TAG_RESUMED_FROM: reclaimed.previous_owner})
        assert provider.submissions == 1
        (batch_id,) = provider.batches
    output = [e for e in result.all_events if e.step_key == "describe" and e.event_type_value == "STEP_OUTPUT"]
    assert output[0].step_output_data.metadata["provider_job_reattached"].value == batch_id
    f = assert_ledger_equals_the_provider(store, pipeline.id, provider, ITEMS)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1})
    assert (f.wasted_calls, f.in_flight_unknown_calls) == (0, 0)
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.job_id, j.status, j.attempt) for j in jobs] == [(batch_id, "collected", 1)]
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


def test_an_expired_batch_is_resubmitted_for_its_unfinished_items_only(store, db_url, monkeypatch):
    with BatchProvider(duration=0.3, expire_first=2) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        run_in_process()
        assert provider.submissions == 2
        first, second = provider.batches.values()
        assert (len(first.lines), len(second.lines)) == (ITEMS, ITEMS - 2)
    (pipeline,) = store.reports.list_pipelines()
    assert_ledger_equals_the_provider(store, pipeline.id, provider, ITEMS)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "batch_expired": ITEMS - 2, "submitted": 1,
                                                    "resubmitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in jobs] == [("expired", 1, ITEMS), ("collected", 2, ITEMS - 2)]


def test_the_ontology_describes_its_columns_as_one_batch(store, db_url, tmp_path):
    from sqlalchemy import create_engine, func, select

    from recovery_pipelines.llm import LLMResource
    from recovery_pipelines.ontology import SourceDatabase, make_ontology_job
    from recovery_pipelines.ontology_schema import MIGRATIONS, ont_columns
    from recovery_pipelines.sample_data import create_sample_database

    shop = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    create_sample_database(shop)
    with BatchProvider(duration=0.3) as provider, DagsterInstance.ephemeral() as instance:
        llm = LLMResource(base_url=provider.url, model="m", api_key="sk-test", batch=True, batch_poll_seconds=0.1)
        result = execute_in_process(make_ontology_job(executor_def=in_process_executor), instance=instance,
                                    resources={"recovery": recovery_resource(database_url=db_url,
                                                                            migration_packages=[MIGRATIONS]),
                                               "llm": llm, "source": SourceDatabase(url=shop)})
        assert result.success
    assert provider.submissions == 1 and provider.chat_calls > 0  # the columns went as a batch, the rest not
    (pipeline,) = store.reports.list_pipelines()
    tables = len(store.pipelines.completed_items(pipeline.id, "enrich_columns"))
    assert tables == len(provider.answered()) > 0
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            undescribed = conn.scalar(select(func.count()).select_from(ont_columns)
                                      .where(ont_columns.c.description == ""))
            described = conn.scalar(select(func.count()).select_from(ont_columns))
    finally:
        engine.dispose()
    assert described > tables and undescribed == 0
    batch_calls = [c for c in store_rows.provider_calls(store, pipeline.id) if c.node_name == "enrich_columns"]
    assert Counter(c.outcome for c in batch_calls) == Counter({"ok": tables, "submitted": 1})


ODD_USAGE = ["12abc", -5, float("nan"), 1e30]  # as F12's chat answers: a batch answer is paid for just the same


def test_batch_answers_with_malformed_usage_are_kept_and_recorded_with_a_note(store, db_url, monkeypatch):
    completion = BatchProvider._completion
    odd = iter(ODD_USAGE)

    def with_odd_usage(body):
        answer = completion(body)
        answer["usage"]["prompt_tokens"] = next(odd, answer["usage"]["prompt_tokens"])
        return answer

    monkeypatch.setattr(BatchProvider, "_completion", staticmethod(with_odd_usage))
    with BatchProvider(duration=0.3) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        run_in_process()
        assert provider.submissions == 1
    (pipeline,) = store.reports.list_pipelines()
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS
    answered = [c for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == "ok"]
    noted = [c for c in answered if c.note]
    assert len(answered) == ITEMS and len(noted) == len(ODD_USAGE)
    assert all(c.tokens_in == 0 and c.cost is None and "prompt_tokens" in c.note for c in noted)
    assert all(c.tokens_in > 0 for c in answered if not c.note)
