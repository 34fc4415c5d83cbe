"""The Anthropic Message Batches adapter against the local stand-in of the API, through the ``anthropic`` SDK: a job
is one batch, its requests named by custom_ids that carry the intent; a batch orphaned before its id was
recorded is found by listing the recent batches and matching their requests to the intent, and another
batch with as many requests is never taken for it."""

from __future__ import annotations

import datetime as dt

import anthropic

from recovery_ext import AnthropicBatchJobs
from recovery_ext._providers.anthropic_batch import custom_id
from recovery_ext._providers.jobs import COMPLETED, EXPIRED, RUNNING
from recovery_pipelines.anthropic_batch_stand_in import AnthropicBatchProvider
from recovery_pipelines.devserver import wait_for


def requests(*keys: str) -> dict:
    return {key: {"model": "claude-stand-in", "max_tokens": 64, "messages": [{"role": "user", "content": key}]}
            for key in keys}


def adapter(provider: AnthropicBatchProvider) -> AnthropicBatchJobs:
    return AnthropicBatchJobs(anthropic.Anthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))


def finished(jobs: AnthropicBatchJobs, job_id: str) -> str:
    wait_for(lambda: jobs.status(job_id) != RUNNING, timeout=30, interval=0.05, what="the batch")
    return jobs.status(job_id)


def test_a_batch_is_submitted_once_and_its_results_come_by_item():
    # in progress until the test says so: a fixed duration can run out before the first status on a busy machine
    with AnthropicBatchProvider(duration=600.0) as provider:
        jobs = adapter(provider)
        job_id = jobs.submit(requests("a", "b"), "token-one")
        assert jobs.status(job_id) == RUNNING and provider.submissions == 1
        provider.duration = 0.0  # the job ends at its next status
        assert finished(jobs, job_id) == COMPLETED
        results = jobs.results(job_id)
        sent = provider.batches[job_id].requests
    assert sorted(results) == ["a", "b"]
    assert results["a"].answer["content"][0]["text"] == "a description of a"
    assert (results["a"].tokens_in, results["a"].tokens_out) == next(
        (i, o) for cid, i, o in provider.answered() if cid == custom_id("token-one", "a", requests("a")["a"]))
    assert {r["custom_id"].split("-")[0] for r in sent} == {"tokenone"}  # the token's head on every request


def test_an_orphan_is_found_by_its_requests_ended_or_still_running_and_never_another():
    with AnthropicBatchProvider(duration=3.0) as provider:
        mine = adapter(provider).submit(requests("a", "b"), "mine")        # created; its id never recorded
        foreign = adapter(provider).submit(requests("x", "y"), "theirs")   # another pipeline's, as many requests
        adapter(provider).submit(requests("z"), "small")                    # fewer requests: never a candidate
        since = dt.datetime.now(dt.UTC)
        resumed = adapter(provider)
        resumed.expect("mine", requests("a", "b"), since)
        running = resumed.find("mine")
        assert sorted(running.split("+")) == sorted([mine, foreign])  # cannot tell yet: both re-attached
        assert finished(resumed, running) == COMPLETED
        results = resumed.results(running)
        assert sorted(results) == ["a", "b"] and results.strays == []  # the foreign answers are not ours
        later = adapter(provider)
        later.expect("mine", requests("a", "b"), since)
        assert later.find("mine") == mine  # ended: matched by its results' custom_ids
        nothing = adapter(provider)
        nothing.expect("never-sent", requests("a", "b"), since)
        assert nothing.find("never-sent") is None  # ended batches that are not its: submit it
        assert provider.submissions == 3


def test_a_batch_the_service_no_longer_knows_and_an_unreadable_line():
    def cut_first(lines: list[str]) -> list[str]:
        return [lines[0][:60], *lines[1:]]

    with AnthropicBatchProvider(duration=0.1, expire_first=1, rewrite_results=cut_first) as provider:
        jobs = adapter(provider)
        job_id = jobs.submit(requests("a", "b", "c"), "t")
        assert finished(jobs, job_id) == EXPIRED
        results = jobs.results(job_id)
        assert (results["a"].error, results["b"].error, results["c"].error) == (
            "unreadable_result", "batch_expired", "batch_expired")  # a's line cut off: only a is redone
        assert job_id in results["a"].note and results.strays == []
        del provider.batches[job_id]
        gone = adapter(provider)
        assert gone.status(job_id) == EXPIRED
        assert gone.results(job_id).absent.error == "job_gone"
