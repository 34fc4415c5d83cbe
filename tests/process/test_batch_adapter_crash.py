"""Anthropic message batches, Bedrock batch inference jobs and Gemini batches that survive kill -9 (SQLite and
PostgreSQL), each driven through its provider's SDK (``anthropic``; botocore; ``google-genai``) against a stand-in
of its wire API (recovery_pipelines/anthropic_batch_stand_in.py, bedrock_batch_stand_in.py,
gemini_batch_stand_in.py), which counts the batches it created and the requests it answered. The run is killed
at each point a crash can fall:

* before the submission reached the provider (the intent is recorded, no batch exists): the resume submits
  it, once;
* between the provider's creating the batch and the run's recording its id: the resume re-attaches to it
  (Anthropic: by listing the recent batches and matching their requests to the intent, as the API takes no
  idempotency key; Bedrock: by creating the job again under the same clientRequestToken, which starts nothing;
  Gemini: by listing the recent batches for the one named after the job's token);
* while the batch runs, and between two of its results being kept: the resume re-attaches by the id.

Afterwards one batch was created, each request answered once, and the ledger's calls and tokens equal the
stand-in's counts. A batch that left items unfinished is resubmitted for those only, and the ledger says so."""

from __future__ import annotations

import random
import signal
from collections import Counter

import batch_adapter_defs
import batch_checks
import pytest
from batch_checks import outcomes
from dagster import DagsterInstance
from ledger_defs import recovery_resource
from provider_job_runs import reattached_to, resume, start_worker

from recovery_ext import execute_in_process
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.anthropic_batch_stand_in import AnthropicBatchProvider
from recovery_pipelines.bedrock_batch_stand_in import BedrockBatchProvider
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.gemini_batch_stand_in import GeminiBatchProvider
from recovery_pipelines.textract_stand_in import STAND_IN_CREDENTIALS

pytestmark = pytest.mark.timeout(300)

ITEMS = 6
STAND_INS = {"anthropic": AnthropicBatchProvider, "bedrock": BedrockBatchProvider, "gemini": GeminiBatchProvider}
# A provider whose submission under the recorded token answers the job it already started: the resume's
# submission after a kill before the id was known is (to the jobs API) a re-attachment.
SUBMIT_REATTACHES = {"anthropic": False, "bedrock": True, "gemini": False}


@pytest.fixture(autouse=True)
def credentials(monkeypatch):
    for name, value in STAND_IN_CREDENTIALS.items():  # botocore signs; the stand-in takes any credentials
        monkeypatch.setenv(name, value)


def config(provider: str, **describe) -> dict:
    return {"ops": {"describe": {"config": {"provider": provider, "items": ITEMS, "poll_seconds": 0.2, **describe}}}}


def assert_ledger_equals_the_provider(store, pipeline_id, stand_in) -> None:
    f = batch_checks.assert_ledger_equals_the_provider(store, pipeline_id, stand_in, None)
    assert f.in_flight_unknown_calls == 0


def job_statuses(store) -> list[str]:
    found = store.reports.list_pipelines()
    return [j.status for j in store.pipelines.provider_jobs(found[0].id)] if found else []


def waiting(store, provider: str) -> bool:
    found = store.reports.list_pipelines()
    return bool(found) and found[0].shown_status == WAITING and f"{provider}-batch job" in found[0].waiting_reason


# point -> (the stand-in's settings, the run's config, when to kill it: None when the run kills itself)
POINTS = {
    "before_submit": (dict(duration=0.5, drop_first_create=120.0), {},
                      lambda store, stand_in, provider: stand_in.creates == 1
                      and job_statuses(store) == ["submitting"]),
    "between_submit_and_id": (dict(duration=3.0, hold_create=120.0), {},
                              lambda store, stand_in, provider: stand_in.submissions == 1
                              and job_statuses(store) == ["submitting"]),
    "while_running": (dict(duration=6.0), {},
                      lambda store, stand_in, provider: stand_in.submissions == 1 and waiting(store, provider)),
    "between_results": (dict(duration=0.5), {"kill_after": random.Random().randint(1, ITEMS - 1)}, None),
}


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("provider", list(STAND_INS))
def test_a_kill_at_any_point_pays_for_the_batch_once(store, db_url, monkeypatch, provider, point):
    settings, describe, reached = POINTS[point]
    run_config = config(provider, **describe)
    with STAND_INS[provider](**settings) as stand_in:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv(batch_adapter_defs.URL_ENV, stand_in.url)
        worker = start_worker("batch_adapter_defs", run_config)
        try:
            if reached is not None:
                wait_for(lambda: reached(store, stand_in, provider), timeout=240, interval=0.05,
                         what=f"the run {point}")
                worker.send_signal(signal.SIGKILL)
        finally:
            assert worker.wait(240) == -signal.SIGKILL, f"the run should have been killed {point}"
        stand_in.hold_create = stand_in.drop_first_create = 0.0
        killed_with = len(stand_in.batches)
        pipeline, result = resume(store, batch_adapter_defs.job, run_config)
        assert stand_in.submissions == 1, f"killed {point}"
        (batch_id,) = stand_in.batches
        answered = Counter(name for name, _, _ in stand_in.answered())
    assert killed_with == (0 if point == "before_submit" else 1)
    fresh = point == "before_submit" and not SUBMIT_REATTACHES[provider]
    assert reattached_to(result) == (None if fresh else batch_id)
    assert len(answered) == ITEMS and set(answered.values()) == {1}  # each request answered (and paid) once
    assert_ledger_equals_the_provider(store, pipeline.id, stand_in)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.job_id, j.status, j.attempt) for j in jobs] == [(batch_id, "collected", 1)]
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


@pytest.mark.parametrize(("provider", "settings", "error", "ended"), [
    ("anthropic", {"expire_first": 2}, "batch_expired", "expired"),   # not reached within 24 h
    ("bedrock", {"fail_first": 2}, "bedrock_500", "collected"),       # PartiallyCompleted: records failed
    ("gemini", {"fail_first": 2}, "gemini_internal", "collected"),    # succeeded, some requests failed
])
def test_a_batch_that_left_items_unfinished_is_resubmitted_for_those_only(store, db_url, monkeypatch, provider,
                                                                           settings, error, ended):
    with STAND_INS[provider](duration=0.3, **settings) as stand_in:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv(batch_adapter_defs.URL_ENV, stand_in.url)
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(batch_adapter_defs.job, instance=instance, run_config=config(provider),
                                        resources={"recovery": recovery_resource()})
        assert result.success
        assert stand_in.submissions == 2
    (pipeline,) = store.reports.list_pipelines()
    assert_ledger_equals_the_provider(store, pipeline.id, stand_in)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, error: ITEMS - 2, "submitted": 1, "resubmitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in jobs] == [(ended, 1, ITEMS), ("collected", 2, ITEMS - 2)]
