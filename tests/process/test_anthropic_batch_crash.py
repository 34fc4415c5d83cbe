"""Anthropic message batches that survive kill -9 (SQLite and PostgreSQL), driven through the ``anthropic`` SDK
against the stand-in of the Message Batches API (recovery_pipelines/anthropic_batch_stand_in.py), which counts
the batches it created and the requests it answered. The run is killed at each point a crash can fall:

* before the submission reached the provider (the intent is recorded, no batch exists): the resume finds no
  batch that matches the intent and submits it, once;
* between the provider's creating the batch and the run's recording its id: the resume lists the recent
  batches, matches one to the intent by its requests and re-attaches (the API has no idempotency key);
* while the batch runs, and between two of its results being kept: the resume re-attaches by the id.

Afterwards one batch was created, each request answered once, and the ledger's calls and tokens equal the
stand-in's counts. An expired batch is resubmitted for its unfinished items only, and the ledger says so."""

from __future__ import annotations

import random
import signal
from collections import Counter

import anthropic_batch_defs
import batch_checks
import pytest
from batch_checks import outcomes
from dagster import DagsterInstance
from ledger_defs import recovery_resource
from provider_job_runs import reattached_to, resume, start_worker

from recovery_ext import execute_in_process
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.anthropic_batch_stand_in import AnthropicBatchProvider
from recovery_pipelines.devserver import wait_for

pytestmark = pytest.mark.timeout(300)

ITEMS = 6


def config(**describe) -> dict:
    return {"ops": {"describe": {"config": {"items": ITEMS, "poll_seconds": 0.2, **describe}}}}


def assert_ledger_equals_the_provider(store, pipeline_id, provider: AnthropicBatchProvider) -> None:
    f = batch_checks.assert_ledger_equals_the_provider(store, pipeline_id, provider, None)
    assert f.in_flight_unknown_calls == 0


def submitting(store) -> bool:
    found = store.reports.list_pipelines()
    return bool(found) and [j.status for j in store.pipelines.provider_jobs(found[0].id)] == ["submitting"]


def waiting(store) -> bool:
    found = store.reports.list_pipelines()
    return bool(found) and found[0].shown_status == WAITING and "anthropic-batch job" in found[0].waiting_reason


# point -> (the stand-in's settings, the run's config, when to kill it: None when the run kills itself)
POINTS = {
    "before_submit": (dict(duration=0.5, drop_first_create=120.0), {},
                      lambda store, provider: provider.creates == 1 and submitting(store)),
    "between_submit_and_id": (dict(duration=3.0, hold_create=120.0), {},
                              lambda store, provider: provider.submissions == 1 and submitting(store)),
    "while_running": (dict(duration=6.0), {}, lambda store, provider: provider.submissions == 1 and waiting(store)),
    "between_results": (dict(duration=0.5), {"kill_after": random.Random().randint(1, ITEMS - 1)}, None),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_at_any_point_pays_for_the_batch_once(store, db_url, monkeypatch, point):
    settings, describe, reached = POINTS[point]
    run_config = config(**describe)
    with AnthropicBatchProvider(**settings) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv(anthropic_batch_defs.URL_ENV, provider.url)
        worker = start_worker("anthropic_batch_defs", run_config)
        try:
            if reached is not None:
                wait_for(lambda: reached(store, provider), timeout=240, interval=0.05, what=f"the run {point}")
                worker.send_signal(signal.SIGKILL)
        finally:
            assert worker.wait(240) == -signal.SIGKILL, f"the run should have been killed {point}"
        provider.hold_create = provider.drop_first_create = 0.0
        killed_with = len(provider.batches)
        pipeline, result = resume(store, anthropic_batch_defs.job, run_config)
        assert provider.submissions == 1, f"killed {point}"
        (batch_id,) = provider.batches
        answered = Counter(cid for cid, _, _ in provider.answered())
    assert killed_with == (0 if point == "before_submit" else 1)
    assert reattached_to(result) == (None if point == "before_submit" else batch_id)
    assert len(answered) == ITEMS and set(answered.values()) == {1}  # each request answered (and paid) once
    assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.job_id, j.status, j.attempt) for j in jobs] == [(batch_id, "collected", 1)]
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


def test_an_expired_batch_is_resubmitted_for_its_unfinished_items_only(store, db_url, monkeypatch):
    with AnthropicBatchProvider(duration=0.3, expire_first=2) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv(anthropic_batch_defs.URL_ENV, provider.url)
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(anthropic_batch_defs.job, instance=instance, run_config=config(),
                                        resources={"recovery": recovery_resource()})
        assert result.success
        first, second = provider.batches.values()
        assert (len(first.requests), len(second.requests)) == (ITEMS, ITEMS - 2)
    (pipeline,) = store.reports.list_pipelines()
    assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "batch_expired": ITEMS - 2, "submitted": 1,
                                                    "resubmitted": 1})
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in jobs] == [("expired", 1, ITEMS), ("collected", 2, ITEMS - 2)]
