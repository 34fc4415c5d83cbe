"""Nothing lost in the OCR job: crashes, double crashes, slow documents and retry delays, each
run as the real job against a real Dagster instance, on SQLite and PostgreSQL, under a CPU hog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context, in_process_executor

from ocr_checks import assert_every_document_completed_once_before_the_pipeline
from helpers import expire, reclaim, reclaim_until_taken
from ocr_run import resource
from recovery_pipelines.devserver import wait_for
from recovery_ext import execute_in_process, make_stuck_item_sensor
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan
from recovery_pipelines import ocr as ocr_module
from recovery_pipelines.ocr import make_ocr_job
from recovery_pipelines.ocr_engine import OcrResult
from recovery_pipelines.sample_data import create_scanned_pdfs

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parents[1] / "support"
DOCS = {f"doc{i}.pdf": [f"INVOICE {i}0{i}", f"Total due {i}1.{i}0 EUR"] for i in range(1, 4)}
FAST = {"retry_initial_delay": 0.2, "retry_max_delay": 0.5, "retry_jitter": 0.0, "wait_poll_interval": 0.2}


@pytest.fixture
def folder(tmp_path):
    create_scanned_pdfs(tmp_path / "scans", DOCS)
    return tmp_path / "scans"


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def quick_recognise(path, *, on_page=None):
    """Stands in for RapidOCR where the queue, not recognition, is under test (RapidOCR itself runs
    in the crash test here and in test_pipelines.py): one page, the document's name as its text."""
    time.sleep(0.2)
    if on_page is not None:
        on_page(1, 1)
    return OcrResult(path.stem, path.stem, 1, 1.0)


def test_a_crash_then_a_second_reclaim_before_the_resumes_ocr_step_loses_no_document(
        store, db_url, folder, dagster_home, cpu_hog):
    """Issue 9's measured sequence: kill -9 the run worker mid-document, reclaim, the first resume
    dies before its OCR step (here: it is reclaimed again before it ever attaches), the second resume
    finishes. The document the first run held is released although the second resume's
    ``resumed_from`` names only the first resume."""
    slow = {**FAST, "item_heartbeat_interval": 0.5, "item_heartbeat_timeout": 600.0}  # a held doc stays held
    first = subprocess.Popen([sys.executable, str(HERE / "ocr_run.py"), db_url, str(folder), "{}", json.dumps(slow)],
                             cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)}, stdout=subprocess.PIPE, text=True)
    try:
        def mid_document():
            items = store.queue.list_items("ocr")
            return any(i.status == "completed" for i in items) and [i for i in items if i.status == "processing"]

        (held,) = wait_for(mid_document, timeout=240, interval=0.05, what="the first run to be mid-document")
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait(30)
    (pipeline,) = store.reports.list_pipelines()
    run_1 = pipeline.owner
    (first_reclaim,) = reclaim_until_taken(store, PassPlan(limit=5, dead_owner_runs=[run_1], launching=True))
    expire(store, pipeline.id)  # resume #1 never attached (its worker died at once): re-orphaned
    (second_reclaim,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert (second_reclaim.epoch, second_reclaim.previous_owner) == (3, first_reclaim.owner)
    assert store.queue.get_item(held.id).status == "processing"  # still held by the dead first run
    tags = {TAG_PIPELINE: str(pipeline.id), TAG_RESUME_NUMBER: str(second_reclaim.resume_number),
            TAG_RESUMED_FROM: second_reclaim.previous_owner}
    job = make_ocr_job(str(folder), executor_def=in_process_executor, ocr_config=slow)
    with DagsterInstance.get() as instance:
        result = execute_in_process(job, instance=instance, tags=tags, resources={"recovery": resource(db_url)})
    assert result.success
    assert_every_document_completed_once_before_the_pipeline(store, pipeline.id, DOCS)
    again = store.queue.get_item(held.id)
    assert again.worker.startswith(result.run_id) and again.attempts == 2
    resets = [t for t in store.reports.transitions_for(entity_type="queue_item", entity_id=held.id)
              if t["event"] == "reset_stale"]
    assert len(resets) == 1 and "reclaimed" in resets[0]["data"]["stale"]


def test_a_document_slower_than_the_stale_threshold_keeps_heartbeating_and_completes(
        store, db_url, folder, monkeypatch, cpu_hog):
    """Seed 003's monitor (the real stuck-item sensor, threshold 1 s) ticks all the while a document
    takes 20 s, more than twice its heartbeat timeout: its heartbeat keeps it alive, so it is never
    reset and its completion is not refused."""
    def slow_first(path, **kw):
        result = quick_recognise(path, **kw)
        if path.name == "doc1.pdf":
            time.sleep(20)
        return result

    monkeypatch.setattr(ocr_module, "recognise", slow_first)
    job = make_ocr_job(str(folder), executor_def=in_process_executor,
                       ocr_config={**FAST, "item_heartbeat_interval": 0.5, "item_heartbeat_timeout": 8.0,
                                   "legacy_stale_seconds": 1.0})
    sensor = make_stuck_item_sensor(job, "ocr", stale_after_seconds=1, minimum_interval_seconds=1)
    stop, ticks = threading.Event(), []

    def monitor():
        with DagsterInstance.ephemeral() as instance:
            while not stop.wait(0.5):
                ctx = build_sensor_context(instance=instance, resources={"recovery": resource(db_url)})
                ticks.append(sensor.evaluate_tick(ctx))
                store.queue.reset_stale(queue="ocr", older_than_seconds=1, reason="reset-stuck command")

    watcher = threading.Thread(target=monitor)
    watcher.start()
    try:
        result = execute_in_process(job, resources={"recovery": resource(db_url)})
    finally:
        stop.set()
        watcher.join(60)
    assert result.success and len(ticks) >= 10
    (slow,) = [i for i in store.queue.list_items("ocr") if i.payload["name"] == "doc1.pdf"]
    events = [t["event"] for t in store.reports.transitions_for(entity_type="queue_item", entity_id=slow.id)]
    assert events == ["claimed", "completed"] and slow.attempts == 1
    assert (slow.completed_at - slow.started_at).total_seconds() >= 20
    assert store.reports.count_events("item_reset") == 0
    assert_every_document_completed_once_before_the_pipeline(store, store.reports.list_pipelines()[0].id, DOCS)
    assert result.output_for_node("ocr_documents") == {
        "queue": "ocr",
        "items_done": len(DOCS),
        "items_failed": 0,
        "items_dead": 0,
    }


def test_a_failing_document_waits_before_its_retry_and_the_node_waits_for_it(
        store, db_url, folder, monkeypatch, cpu_hog):
    failures = []

    def flaky(path, **kw):
        if path.name == "doc2.pdf" and not failures:
            failures.append(time.monotonic())
            raise TimeoutError("OCR engine timed out")
        return quick_recognise(path, **kw)

    monkeypatch.setattr(ocr_module, "recognise", flaky)
    job = make_ocr_job(str(folder), executor_def=in_process_executor,
                       ocr_config={**FAST, "retry_initial_delay": 4.0, "retry_max_delay": 60.0})
    result = execute_in_process(job, resources={"recovery": resource(db_url)})
    assert result.success
    (doc,) = [i for i in store.queue.list_items("ocr") if i.payload["name"] == "doc2.pdf"]
    history = store.reports.transitions_for(entity_type="queue_item", entity_id=doc.id)
    assert [(t["from_status"], t["to_status"]) for t in history] == [
        ("ready", "processing"), ("processing", "ready"), ("ready", "processing"), ("processing", "completed")]
    failed, retried = history[1], history[2]
    assert failed["data"]["retry_in_seconds"] == 4.0 and "timeout" in failed["data"]["error"]
    assert (retried["at"] - failed["at"]).total_seconds() >= 4.0  # on the database clock
    assert doc.attempts == 2 and doc.available_at is None
    assert_every_document_completed_once_before_the_pipeline(store, store.reports.list_pipelines()[0].id, DOCS)
