"""The OCR job under a real `dagster dev`: kill -9 the run worker mid-document, then kill -9 the
first resume's run worker as soon as it attaches. Every document ends completed exactly once,
and the pipeline completes only after the last one."""

from __future__ import annotations

import os
import signal

import pytest
from dagster import DagsterRunStatus

from recovery_pipelines.devserver import process_alive, wait_for
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_pipelines.sample_data import create_scanned_pdfs
from ocr_checks import assert_every_document_completed_once_before_the_pipeline

# Enough documents that the killed run's step process (a zombie: killing the run worker leaves it
# running, fenced only once the pipeline is reclaimed) cannot finish them all, and so complete the
# pipeline itself, before the orphan sensor's next tick reclaims it: with three, a fast machine
# finished them first and no resume was needed.
DOCS = {f"doc{i}.pdf": [f"INVOICE {i}0{i}", f"Total due {i}1.{i}0 EUR"] for i in range(1, 9)}

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


DEFS = "ocr_e2e_defs.py"


def dev_env(request) -> dict[str, str]:
    folder = request.getfixturevalue("tmp_path_factory").mktemp("scans")
    create_scanned_pdfs(folder, DOCS)
    return {"OCR_E2E_FOLDER": str(folder)}


def resume_runs(dev, pipeline_id):
    """The pipeline's resume runs, in order (the first run is tagged with the pipeline too)."""
    runs = [r for r in dev.runs(tags={TAG_PIPELINE: str(pipeline_id)}) if TAG_RESUME_NUMBER in r.tags]
    return sorted(runs, key=lambda r: int(r.tags[TAG_RESUME_NUMBER]))


def test_kill_9_mid_document_then_kill_9_of_the_resume_as_it_attaches(dev, store):
    run_id = dev.launch("ocr_documents", {})

    def mid_document():  # the first document done, the next one held: most of the work still ahead
        items = store.queue.list_items("ocr")
        return any(i.status == "completed" for i in items) and [i for i in items if i.status == "processing"]

    wait_for(mid_document, timeout=300, interval=0.05, what="the first run to be mid-document")
    worker = dev.run_worker_pid(run_id)
    os.kill(worker, signal.SIGKILL)
    pipeline = store.pipelines.find_pipeline(run_id)
    (first_resume,) = wait_for(lambda: resume_runs(dev, pipeline.id), timeout=120, interval=0.05,
                               what="the first resume run")
    wait_for(lambda: store.pipelines.get_pipeline(pipeline.id).owner == first_resume.run_id, timeout=180, interval=0.02,
             what="the first resume to attach")
    resume_worker = wait_for(lambda: dev.run_worker_pid(first_resume.run_id), timeout=60, interval=0.02,
                             what="the first resume's run worker")
    os.kill(resume_worker, signal.SIGKILL)
    wait_for(lambda: store.pipelines.get_pipeline(pipeline.id).status == "completed", timeout=600, interval=0.5,
             what="the pipeline to complete")
    runs = resume_runs(dev, pipeline.id)
    assert len(runs) == 2 and store.pipelines.get_pipeline(pipeline.id).resume_count == 2
    dev.wait_run(runs[-1].run_id, timeout=120)
    assert_every_document_completed_once_before_the_pipeline(store, pipeline.id, DOCS)
    assert dev.run(run_id).status == DagsterRunStatus.FAILURE
    # every document that a superseded run still held was completed by the last resume, none by a zombie
    winners = {i.worker.split(":")[0] for i in store.queue.list_items("ocr")}
    assert winners <= {run_id, runs[-1].run_id}
    wait_for(lambda: not process_alive(worker) and not process_alive(resume_worker), timeout=60,
             what="the killed workers to be gone")
    # What this run exercised (printed for the record; the outcome above holds either way).
    starts = [t["data"]["owner"] for t in store.reports.transitions_for(pipeline_id=pipeline.id)
              if t["entity_type"] == "node" and t["event"] == "started"]
    released = [(t["entity_id"], t["data"]["worker"]) for t in store.reports.transitions_for(entity_type="queue_item")
                if t["event"] == "reset_stale"]
    print(f"node starts by owner: {starts}; released documents (id, holder): {released}; "
          f"first resume reached OCR: {starts.count(first_resume.run_id) > 1}")
