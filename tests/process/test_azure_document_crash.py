"""Azure Document Intelligence analyses that survive kill -9 (SQLite and PostgreSQL), driven through the
azure-ai-documentintelligence SDK against the stand-in of its wire API (recovery_pipelines/azure_document_stand_in.py),
which counts the analyses it started and bills each one that succeeded. The run is killed at each point a crash
can fall:

* before the first submission reached Azure (the intent and the document's mark are recorded, no analysis
  exists): the resume submits it;
* between Azure's starting an analysis and the run's recording its id (the first document's, or the third's
  after two were accepted and recorded): Azure takes no idempotency key and lists no analyses, so the resume
  cannot find that one analysis: it re-uses the documents already accepted and submits the rest, and the one
  whose 202 was lost is analysed (and billed) twice. This is the one window where a document is paid twice (one
  round trip); the ledger says so: that document has a row ``unfindable_submission`` (the resume cannot tell
  this point from the one before, whose marked document it names too);
* while the analyses run, and between two of their results being kept: the resume re-attaches by the id.

Afterwards each document's answer was kept once, the ledger's pages are those of the analyses kept, every
analysis the stand-in billed and no item kept is named by an ``unfindable_submission`` row, and the key is in no
ledger row, event or output."""

from __future__ import annotations

import random
import signal
from collections import Counter

import azure_document_defs
import pytest
from batch_checks import outcomes
from provider_job_runs import reattached_to, resume, start_worker
import store_rows

from recovery_ext._providers.jobs import UNFINDABLE
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.azure_document_stand_in import STAND_IN_KEY, AzureDocumentProvider
from recovery_pipelines.devserver import wait_for

pytestmark = pytest.mark.timeout(300)

ITEMS = 4
KEYS = [f"d{i:02d}" for i in range(ITEMS)]
ACCEPTED = 2  # documents Azure accepted, and the run recorded, before the 202 the kill loses


def job_statuses(store) -> list[str]:
    found = store.reports.list_pipelines()
    return [j.status for j in store.pipelines.provider_jobs(found[0].id)] if found else []


def waiting(store) -> bool:
    found = store.reports.list_pipelines()
    return bool(found) and found[0].shown_status == WAITING and "azure-document job" in found[0].waiting_reason


def recorded_parts(store) -> dict[str, str]:
    found = store.reports.list_pipelines()
    return dict(store.pipelines.provider_jobs(found[0].id)[0].accepted) if found else {}


# point -> (the stand-in's settings, the run's config, when to kill it: None when the run kills itself)
POINTS = {
    "before_submit": (dict(duration=0.5, drop_first_create=120.0), {},
                      lambda store, stand_in: stand_in.creates == 1 and job_statuses(store) == ["submitting"]),
    "between_submit_and_id": (dict(duration=2.0, hold_create=120.0), {},
                              lambda store, stand_in: stand_in.submissions == 1
                              and job_statuses(store) == ["submitting"]),
    "after_k_of_n_accepted": (dict(duration=2.0, hold_create=120.0, hold_nth=ACCEPTED + 1), {},
                              lambda store, stand_in: stand_in.submissions == ACCEPTED + 1
                              and len(recorded_parts(store)) == ACCEPTED),
    "while_running": (dict(duration=6.0), {},
                      lambda store, stand_in: stand_in.submissions == ITEMS and waiting(store)),
    "between_results": (dict(duration=0.5), {"kill_after": random.Random().randint(1, ITEMS - 1)}, None),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_at_any_point_keeps_each_answer_once_and_ledgers_what_may_be_paid_twice(store, db_url, monkeypatch,
                                                                                       tmp_path, point):
    settings, describe, reached = POINTS[point]
    run_config = {"ops": {"read_scans": {"config": {"items": ITEMS, "poll_seconds": 0.2, **describe}}}}
    for key in KEYS:
        (tmp_path / f"{key}.png").write_bytes(b"scan")
    with AzureDocumentProvider({"scans": tmp_path}, **settings) as stand_in:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv(azure_document_defs.URL_ENV, stand_in.url)
        worker = start_worker("azure_document_defs", run_config)
        try:
            if reached is not None:
                wait_for(lambda: reached(store, stand_in), timeout=240, interval=0.05, what=f"the run {point}")
                worker.send_signal(signal.SIGKILL)
        finally:
            assert worker.wait(240) == -signal.SIGKILL, f"the run should have been killed {point}"
        stand_in.hold_create = stand_in.drop_first_create = 0.0
        killed_with, killed_ids = stand_in.submissions, recorded_parts(store)
        pipeline, result = resume(store, azure_document_defs.job, run_config)
        per_document = stand_in.submissions_per_document()
        wait_for(lambda: len(stand_in.charged()) == stand_in.submissions, timeout=30, interval=0.05,
                 what="every analysis started to end")
        billed = {result_id: name for result_id, name, _ in stand_in.charged()}
    # the document whose 202 the kill lost, and the documents Azure had accepted (and the run recorded) before it
    lost_202, accepted = {"between_submit_and_id": (KEYS[0], []),
                          "after_k_of_n_accepted": (KEYS[ACCEPTED], KEYS[:ACCEPTED])}.get(point, (None, []))
    assert killed_with == {"before_submit": 0, "between_submit_and_id": 1,
                           "after_k_of_n_accepted": ACCEPTED + 1}.get(point, ITEMS)
    # at most one analysis is started twice: the one whose 202 the kill lost; those accepted before it never
    assert per_document == Counter({f"{k}.png": 1 + (k == lost_202) for k in KEYS})
    assert sum(per_document.values()) <= ITEMS + 1
    # the resume names the document whose POST may have been on its way (before_submit: the dropped one)
    marked = {"before_submit": KEYS[0]}.get(point, lost_202)
    kept = store.pipelines.completed_items(pipeline.id, "read_scans")
    assert sorted(kept) == KEYS
    kept_ids = {k: v["result_id"] for k, v in kept.items()}
    (job,) = store.pipelines.provider_jobs(pipeline.id)
    assert (job.status, job.attempt) == ("collected", 1)
    assert [kept_ids[k] for k in accepted] == [killed_ids[k] for k in accepted]  # re-used, not analysed again
    assert reattached_to(result, "read_scans") == (None if marked else job.job_id)
    calls = store_rows.provider_calls(store, pipeline.id)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1, **({UNFINDABLE: 1} if marked
                                                                                    else {})})
    # the ledger's pages are those of the analyses kept; what was billed beyond them is named as maybe paid twice
    assert sorted(c.cost for c in calls if c.outcome == "ok") == [azure_document_defs.PRICE_PER_PAGE] * ITEMS
    assert set(kept_ids.values()) <= set(billed)
    orphans = [billed[r] for r in billed if r not in kept_ids.values()]
    assert orphans == ([f"{lost_202}.png"] if lost_202 else [])
    named = [c.note.split("'")[1] for c in calls if c.outcome == UNFINDABLE]
    assert named == ([marked] if marked else [])
    shown = [repr(c) for c in calls] + [repr(e) for e in result.all_events] + [repr(kept)]
    assert not [text for text in shown if STAND_IN_KEY in text]


def test_an_analysis_that_failed_or_whose_result_is_gone_is_resubmitted_for_those_only(store, db_url, monkeypatch,
                                                                                      tmp_path):
    from dagster import DagsterInstance
    from ledger_defs import recovery_resource

    from recovery_ext import execute_in_process

    for key in KEYS:
        (tmp_path / f"{key}.png").write_bytes(b"scan")
    with AzureDocumentProvider({"scans": tmp_path}, duration=0.3, fail_first={"d01.png"}) as stand_in:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv(azure_document_defs.URL_ENV, stand_in.url)
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(azure_document_defs.job, instance=instance,
                                        run_config={"ops": {"read_scans": {"config": {"items": ITEMS}}}},
                                        resources={"recovery": recovery_resource()})
        assert result.success
        assert stand_in.submissions_per_document() == Counter({"d00.png": 1, "d01.png": 2, "d02.png": 1,
                                                               "d03.png": 1})
    (pipeline,) = store.reports.list_pipelines()
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "azure_failed": 1, "submitted": 1,
                                                    "resubmitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in jobs] == [("failed", 1, ITEMS), ("collected", 2, 1)]
