"""The OCR job's async-provider mode (SQLite and PostgreSQL), end to end against the local Textract stand-in
through botocore: every document recognised once; a kill -9 while the Textract jobs run is followed by a
resume that re-attaches (each document's job started once); a FAILED job is resubmitted for its document
only, and the ledger says so. Every ledger figure equals the stand-in's."""

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
from dagster import DagsterInstance, in_process_executor
from helpers import reclaim_until_taken
from ocr_checks import assert_every_document_completed_once_before_the_pipeline
from ocr_run import resource

from recovery_ext import execute_in_process
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.ocr import make_ocr_job
from recovery_pipelines.sample_data import create_scanned_pdfs
from recovery_pipelines.textract_stand_in import STAND_IN_CREDENTIALS, TextractProvider
import store_rows

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parents[1] / "support"
DOCS = {f"doc{i}.pdf": [f"INVOICE {i}0{i}", f"Total due {i}1.{i}0 EUR"] for i in range(1, 4)}
PRICE = 0.0015  # per page, as Textract's DetectDocumentText is billed


@pytest.fixture
def folder(tmp_path, monkeypatch):
    for name, value in STAND_IN_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    create_scanned_pdfs(tmp_path / "scans", DOCS)
    return tmp_path / "scans"


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def textract_config(provider: TextractProvider) -> dict:
    return {"provider": "textract", "textract_endpoint_url": provider.url, "textract_bucket": "scans",
            "textract_price_per_page": PRICE, "provider_poll_seconds": 0.2, "item_heartbeat_interval": 0.5,
            "item_heartbeat_timeout": 30.0, "wait_poll_interval": 0.2}


def run(db_url, folder, config, tags=None):
    job = make_ocr_job(str(folder), executor_def=in_process_executor, ocr_config=config)
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(job, instance=instance, tags=tags or {}, resources={"recovery": resource(db_url)})
    assert result.success
    return result


def outcomes(store, pipeline_id) -> Counter:
    return Counter(c.outcome for c in store_rows.provider_calls(store, pipeline_id) if c.node_name == "ocr_documents")


def assert_ledger_equals_the_provider(store, pipeline_id, provider: TextractProvider) -> None:
    charged = provider.charged()
    calls = outcomes(store, pipeline_id)
    assert calls["ok"] == len(charged)
    assert calls["submitted"] + calls["resubmitted"] == len({t.split("-")[0] for t in provider.starts})
    assert sum(len(j.items) for j in store.pipelines.provider_jobs(pipeline_id)) == provider.submissions
    f = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    assert f.cost == pytest.approx(PRICE * sum(pages for _, pages in charged))
    assert sorted(name for name, _ in charged) == sorted(DOCS)  # each document paid once


def assert_every_text_is_the_documents(store):
    for item in store.queue.list_items("ocr"):
        assert item.result["raw_text"] == "\n".join(DOCS[item.payload["name"]])
        assert item.result["pages"] == 1 and item.result["provider_job"]


def test_the_ocr_job_recognises_its_documents_as_one_textract_job(store, db_url, folder):
    with TextractProvider({"scans": folder}, duration=0.5) as provider:
        result = run(db_url, folder, textract_config(provider))
        assert provider.submissions == len(DOCS) and set(provider.starts.values()) == {1}
    (pipeline,) = store.reports.list_pipelines()
    assert_every_document_completed_once_before_the_pipeline(store, pipeline.id, DOCS)
    assert_every_text_is_the_documents(store)
    assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": len(DOCS), "submitted": 1})
    assert result.output_for_node("ocr_documents") == {"queue": "ocr", "items_done": len(DOCS), "items_failed": 0,
                                                       "items_dead": 0}


def kill_and_resume(store, db_url, folder, provider: TextractProvider, killed_when):
    """Run the OCR job in a process, kill -9 it once ``killed_when()`` holds, take the pipeline over as the orphan
    sensor would and resume it in this one; the pipeline and the resume's result."""
    config = textract_config(provider)
    worker = subprocess.Popen([sys.executable, str(HERE / "ocr_run.py"), db_url, str(folder), "{}",
                               json.dumps(config)], cwd=HERE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])])},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(killed_when, timeout=240, interval=0.02, what="the point to kill the run at")
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.wait(30)
    (pipeline,) = store.reports.list_pipelines()
    (reclaimed,) = reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]))
    result = run(db_url, folder, config, {TAG_PIPELINE: str(reclaimed.pipeline_id),
                                          TAG_RESUME_NUMBER: str(reclaimed.resume_number),
                                          TAG_RESUMED_FROM: reclaimed.previous_owner})
    return pipeline, result


def assert_reattached_to_one_job_per_document(store, pipeline, result, provider: TextractProvider):
    assert provider.submissions_per_document() == Counter(list(DOCS))  # one Textract job per document, no more
    (job,) = store.pipelines.provider_jobs(pipeline.id)
    assert (job.status, job.attempt) == ("collected", 1) and json.loads(job.job_id).keys() == set(job.items)
    assert sorted(json.loads(job.job_id).values()) == sorted(provider.jobs)
    output = [e for e in result.all_events if e.step_key == "ocr_documents" and e.event_type_value == "STEP_OUTPUT"]
    assert output[0].step_output_data.metadata["provider_job_reattached"].value == job.job_id
    assert_every_document_completed_once_before_the_pipeline(store, pipeline.id, DOCS)
    assert_every_text_is_the_documents(store)
    assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": len(DOCS), "submitted": 1})
    f = store.reports.provider_costs(pipeline.id).pipelines[pipeline.id]
    assert (f.wasted_calls, f.in_flight_unknown_calls) == (0, 0)


def test_a_kill_during_the_textract_wait_is_reattached_not_resubmitted(store, db_url, folder, dagster_home):
    polls = random.randint(1, 30)  # a random point of the wait: after this many of the stand-in's answers to a poll
    with TextractProvider({"scans": folder}, duration=8.0) as provider:
        def waiting():
            found = store.reports.list_pipelines()
            return (provider.gets >= polls and found and found[0].shown_status == WAITING
                    and "textract job" in found[0].waiting_reason)

        pipeline, result = kill_and_resume(store, db_url, folder, provider, waiting)
        assert set(provider.starts.values()) == {1}  # the resume started nothing, not even under the same token
    assert_reattached_to_one_job_per_document(store, pipeline, result, provider)


def test_a_kill_between_two_documents_starts_is_reattached_by_the_same_tokens(store, db_url, folder, dagster_home):
    """Killed after the first document's job started and before the job's ids were written: the resume submits
    under the same token, and Textract answers the jobs already started instead of starting them again."""
    with TextractProvider({"scans": folder}, duration=2.0, start_delay=1.0) as provider:
        pipeline, result = kill_and_resume(store, db_url, folder, provider, lambda: provider.submissions == 1)
        assert max(provider.starts.values()) == 2  # a start repeated under its token ...
    assert provider.submissions == len(DOCS)  # ... started no job twice
    assert_reattached_to_one_job_per_document(store, pipeline, result, provider)


def test_a_kill_between_two_documents_results_keeps_the_first_and_reattaches_for_the_rest(
        store, db_url, folder, dagster_home):
    """Killed once the job finished and its first document was kept: the resume re-attaches to the same job for
    the other two, and nothing is started or paid again."""
    with TextractProvider({"scans": folder}, duration=1.0, result_delay=1.5) as provider:
        def first_kept():
            # at least one: a busy machine may read the queue only after a second document was kept too (each read
            # of a result takes 1.5 s, so the third is still to come, and the resume re-attaches for it)
            return sum(1 for item in store.queue.list_items("ocr") if item.status == "completed") >= 1

        pipeline, result = kill_and_resume(store, db_url, folder, provider, first_kept)
        assert set(provider.starts.values()) == {1}
    assert_reattached_to_one_job_per_document(store, pipeline, result, provider)
    kept = [c for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == "ok"]
    assert len({c.run_id for c in kept}) == 2  # one document's row from the killed run, two from the resume


def test_a_failed_textract_job_is_resubmitted_for_its_document_only(store, db_url, folder):
    with TextractProvider({"scans": folder}, duration=0.3, fail_first={"doc2.pdf"}) as provider:
        run(db_url, folder, textract_config(provider))
        assert provider.submissions_per_document() == Counter({"doc1.pdf": 1, "doc2.pdf": 2, "doc3.pdf": 1})
        assert provider.statuses() == Counter({"SUCCEEDED": len(DOCS), "FAILED": 1})
    (pipeline,) = store.reports.list_pipelines()
    assert_every_document_completed_once_before_the_pipeline(store, pipeline.id, DOCS)
    assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": len(DOCS), "textract_failed": 1, "submitted": 1,
                                                    "resubmitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in jobs] == [("failed", 1, len(DOCS)), ("collected", 2, 1)]


def test_a_textract_job_the_service_no_longer_knows_is_resubmitted_for_its_document_only(store, db_url, folder):
    with TextractProvider({"scans": folder}, duration=0.3, forget_first={"doc3.pdf"}) as provider:
        run(db_url, folder, textract_config(provider))
        assert provider.submissions_per_document() == Counter({"doc1.pdf": 1, "doc2.pdf": 1, "doc3.pdf": 2})
    (pipeline,) = store.reports.list_pipelines()
    assert_every_document_completed_once_before_the_pipeline(store, pipeline.id, DOCS)
    assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": len(DOCS), "job_expired": 1, "submitted": 1,
                                                    "resubmitted": 1})
    (gone,) = [c for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == "job_expired"]
    assert gone.item_key is not None
    first, second = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in (first, second)] == [("expired", 1, len(DOCS)),
                                                                            ("collected", 2, 1)]
    assert first.token != second.token and json.loads(second.job_id).keys() == {gone.item_key}


def test_a_document_textract_fails_on_in_every_attempt_fails_its_queue_item(store, db_url, folder):
    with TextractProvider({"scans": folder}, duration=0.3, fail_first={"doc2.pdf"}) as provider:
        result = run(db_url, folder, {**textract_config(provider), "provider_max_attempts": 1})
    (pipeline,) = store.reports.list_pipelines()
    items = {item.payload["name"]: item for item in store.queue.list_items("ocr")}
    assert {name: item.status for name, item in items.items()} == {"doc1.pdf": "completed", "doc2.pdf": "failed",
                                                                   "doc3.pdf": "completed"}
    assert items["doc2.pdf"].last_error.startswith("provider_job")
    assert outcomes(store, pipeline.id) == Counter({"ok": 2, "textract_failed": 1, "submitted": 1})
    assert result.output_for_node("ocr_documents") == {"queue": "ocr", "items_done": 2, "items_failed": 1,
                                                       "items_dead": 0}
    assert store.pipelines.get_pipeline(pipeline.id).status == "completed"
