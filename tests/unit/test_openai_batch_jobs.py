"""The OpenAI Batch adapter against the local stand-in of the Batch API (through the ``openai`` SDK): a finished
batch's output is read line by line, so a line it cannot read, a duplicate or unknown ``custom_id`` costs that
line only; a batch the provider no longer knows is expired with every item gone; every read is bounded."""

from __future__ import annotations

import json

import openai
import pytest

from recovery_ext import OpenAIBatchJobs, ReadLimits
from recovery_ext._providers.jobs import COMPLETED, EXPIRED, RUNNING
from recovery_pipelines.batch_stand_in import BatchProvider
from recovery_pipelines.demo_batch import request
from recovery_pipelines.devserver import wait_for

KEYS = [f"t{i:02d}" for i in range(5)]


def submitted(provider: BatchProvider, **options) -> tuple[OpenAIBatchJobs, str]:
    jobs = OpenAIBatchJobs(openai.OpenAI(base_url=provider.url, api_key="sk-test", max_retries=0), **options)
    job_id = jobs.submit({key: request(key) for key in KEYS}, "a-token")
    wait_for(lambda: jobs.status(job_id) != RUNNING, timeout=30, interval=0.05, what="the batch")
    return jobs, job_id


def faulty(lines: list[dict]) -> list[str]:
    """t01 cut off mid-line, t03 replaced by ``[]``, t02 answered twice, and an answer to an unknown item."""
    text = {line["custom_id"]: json.dumps(line) for line in lines}
    stranger = json.dumps({**lines[0], "custom_id": "zz"})
    return [text["t00"], text["t01"][:70], text["t02"], text["t02"], "[]", text["t04"], stranger]


def test_one_unreadable_line_costs_only_its_own_item():
    with BatchProvider(duration=0.1, rewrite_output=faulty) as provider:
        jobs, job_id = submitted(provider)
        assert jobs.status(job_id) == COMPLETED
        results = jobs.results(job_id)
    kept = {key for key, found in results.items() if found.error is None and key in KEYS}
    assert kept == {"t00", "t02", "t04"}  # every readable answer is kept
    assert all(results[key].tokens_in > 0 and results[key].answer["choices"] for key in kept)
    cut = results["t01"]  # the cut-off line still names its item: recorded with the provider's words
    assert cut.error == "unreadable_result" and job_id in cut.note and '"custom_id": "t01"' in cut.note
    assert "t03" not in results  # the `[]` names no item: t03 is absent, so it is redone
    strays = sorted((s.error, s.note.split(": ", 1)[1][:40]) for s in results.strays)
    assert [error for error, _ in strays] == ["duplicate_result", "unreadable_result"]
    assert results["zz"].error is None  # an item the job does not hold: run_provider_job ledgers it as a stray
    duplicate = next(s for s in results.strays if s.error == "duplicate_result")
    assert duplicate.tokens_in > 0  # paid for: its tokens are in the ledger


def test_a_batch_the_provider_no_longer_knows_is_expired_with_every_item_gone():
    with BatchProvider(duration=0.1, forget_first=True) as provider:
        jobs = OpenAIBatchJobs(openai.OpenAI(base_url=provider.url, api_key="sk-test", max_retries=0))
        job_id = jobs.submit({key: request(key) for key in KEYS}, "a-token")
        assert jobs.status(job_id) == EXPIRED
        results = jobs.results(job_id)
    assert dict(results) == {}
    assert results.absent.error == "job_gone" and job_id in results.absent.note and "No batch found" in \
        results.absent.note


def test_an_output_file_past_the_byte_limit_is_read_up_to_it():
    with BatchProvider(duration=0.1) as provider:
        jobs, job_id = submitted(provider, limits=ReadLimits(bytes=1500))
        results = jobs.results(job_id)
    assert 0 < len(results) < len(KEYS)  # what was read before the limit is kept
    assert results.absent.error == "unbounded_result" and "1500 bytes" in results.absent.note


def test_a_listing_that_repeats_its_cursor_is_read_a_bounded_number_of_times():
    with BatchProvider(duration=0.1, endless_list=True) as provider:
        jobs = OpenAIBatchJobs(openai.OpenAI(base_url=provider.url, api_key="sk-test", max_retries=0))
        jobs.submit({"t00": request("t00")}, "a-token")
        assert jobs.find("another-token") is None
        assert provider.list_pages <= 2
        assert jobs.find("a-token") is not None


def test_an_unknown_batch_status_is_an_error_naming_the_batch(monkeypatch):
    with BatchProvider(duration=0.1) as provider:
        jobs, job_id = submitted(provider)
        monkeypatch.setattr(provider, "_batch_json", lambda batch: {"id": batch.id, "object": "batch",
                                                                     "status": "melting"})
        with pytest.raises(Exception) as raised:
            jobs.status(job_id)
    assert job_id in str(raised.value) and "melting" in str(raised.value)


def test_a_batch_that_failed_as_a_whole_gives_each_item_its_errors(monkeypatch):
    with BatchProvider(duration=0.1) as provider:
        jobs, job_id = submitted(provider)
        shown = provider._batch_json

        def failed(batch):
            return {**shown(batch), "status": "failed", "output_file_id": None, "error_file_id": None,
                    "errors": {"object": "list", "data": [{"code": "invalid_json_line", "line": 1,
                                                           "message": "This line is not parseable as valid JSON."}]}}

        monkeypatch.setattr(provider, "_batch_json", failed)
        results = jobs.results(job_id)
    assert dict(results) == {}
    assert results.absent.error == "batch_failed" and "invalid_json_line" in results.absent.note


def test_the_stand_in_holds_a_creations_answer_while_the_batch_exists():
    """The crash tests' premise (tests/process/test_provider_job_paths.py): with ``hold_create`` the batch exists
    at the provider, findable by its token, while its id has not reached the client."""
    with BatchProvider(duration=0.1, hold_create=60.0) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key="sk-test", max_retries=0, timeout=1.0)
        jobs = OpenAIBatchJobs(client)
        with pytest.raises(openai.APITimeoutError):
            jobs.submit({key: request(key) for key in KEYS}, "a-token")
        assert provider.submissions == 1
        provider.hold_create = 0.0
        (batch_id,) = provider.batches
        assert jobs.find("a-token") == batch_id
