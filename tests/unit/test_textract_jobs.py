"""The Textract adapter against the local stand-in of Textract's wire API (AWS JSON 1.1 through botocore): a
start repeated under the same token starts nothing, results are read page by page, and a failed, partly
read or forgotten job comes back as item errors."""

from __future__ import annotations

import json

import pytest

from recovery_ext import ConfigurationError, ReadLimits, TextractJobs, classify
from recovery_ext._providers.jobs import COMPLETED, EXPIRED, FAILED, RUNNING
from recovery_ext._providers.textract_jobs import document_token
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.sample_data import create_scanned_pdfs
from recovery_pipelines.textract_stand_in import STAND_IN_CREDENTIALS, TextractProvider

DOCS = {"a.pdf": ["INVOICE 101", "Total due 11.10 EUR"], "b.pdf": ["LETTER 2"]}


@pytest.fixture
def scans(tmp_path, monkeypatch):
    for name, value in STAND_IN_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    create_scanned_pdfs(tmp_path / "scans", DOCS)
    return tmp_path / "scans"


def requests(*names):
    return {name: {"S3Object": {"Bucket": "scans", "Name": name}} for name in names}


def test_a_start_under_the_same_token_answers_the_same_jobs_and_results_come_page_by_page(scans):
    # The jobs run until the test finishes them: a job on a clock could end before its RUNNING is checked.
    with TextractProvider({"scans": scans}, duration=None) as provider:
        jobs = TextractJobs.connect(region_name="us-east-1", endpoint_url=provider.url, max_results=2,
                                    price_per_page=0.0015)
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "t" * 32)
        assert jobs.submit(requests("a.pdf", "b.pdf"), "t" * 32) == job_id  # a resume's submission
        assert provider.submissions == 2 and set(provider.starts.values()) == {2}
        assert jobs.status(job_id) == RUNNING
        provider.finish_jobs()
        wait_for(lambda: jobs.status(job_id) == COMPLETED, timeout=30, interval=0.05, what="the jobs")
        gets = provider.gets
        results = jobs.results(job_id)
        assert provider.gets == gets  # nothing read until a document is asked for: each is kept as it is read
        first = results["a.pdf"]
        assert provider.gets - gets >= 4  # a.pdf: PAGE, 2 LINEs and 5 WORDs read 2 blocks at a time
        read = provider.gets
        assert results["a.pdf"] is first and provider.gets == read  # kept, not read again
        assert set(results) == {"a.pdf", "b.pdf"} and provider.gets > read  # b.pdf read once asked for
    assert results["a.pdf"].answer["text"] == "INVOICE 101\nTotal due 11.10 EUR"
    assert results["b.pdf"].answer["text"] == "LETTER 2"
    assert results["a.pdf"].answer["job_id"] == json.loads(job_id)["a.pdf"]
    assert (results["a.pdf"].answer["pages"], results["a.pdf"].cost) == (1, 0.0015)
    assert 0.9 < results["a.pdf"].answer["confidence"] <= 1


def test_a_failed_or_forgotten_document_is_an_item_error(scans):
    with TextractProvider({"scans": scans}, duration=0.1, fail_first={"b.pdf"}) as provider:
        jobs = TextractJobs.connect(region_name="us-east-1", endpoint_url=provider.url)
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "f" * 32)
        wait_for(lambda: jobs.status(job_id) != RUNNING, timeout=30, interval=0.05, what="the jobs")
        assert jobs.status(job_id) == FAILED
        results = jobs.results(job_id)
        assert (results["a.pdf"].error, results["b.pdf"].error) == (None, "textract_failed")
        provider.forget(json.loads(job_id)["a.pdf"])
        fresh = TextractJobs(jobs.client)
        assert fresh.results(job_id)["a.pdf"].error == "job_expired"
        only_a = json.dumps({"a.pdf": json.loads(job_id)["a.pdf"]})
        assert fresh.status(only_a) == EXPIRED


def test_the_service_errors_arrive_as_botocore_errors_the_classifier_reads(scans):
    with TextractProvider({"scans": scans}) as provider:
        jobs = TextractJobs.connect(region_name="us-east-1", endpoint_url=provider.url)
        with pytest.raises(Exception) as missing:
            jobs.submit(requests("nope.pdf"), "m" * 32)
        assert type(missing.value).__name__ == "InvalidS3ObjectException"
        assert not classify(missing.value).retryable
        jobs.submit(requests("a.pdf"), "x" * 32)
        with pytest.raises(Exception) as mismatch:  # the same token for another document
            jobs.client.start_document_text_detection(DocumentLocation=requests("b.pdf")["b.pdf"],
                                                      ClientRequestToken=document_token("x" * 32, "a.pdf"))
        assert type(mismatch.value).__name__ == "IdempotentParameterMismatchException"
        assert provider.submissions == 1
    with pytest.raises(ConfigurationError):
        TextractJobs(jobs.client, max_results=1001)


@pytest.mark.timeout(60)
def test_an_endpoint_that_repeats_its_page_token_is_read_once_round_not_for_ever(scans):
    with TextractProvider({"scans": scans}, duration=0.1, repeat_token=True) as provider:
        jobs = TextractJobs.connect(region_name="us-east-1", endpoint_url=provider.url, max_results=1)
        job_id = jobs.submit(requests("a.pdf"), "r" * 32)
        wait_for(lambda: jobs.status(job_id) == COMPLETED, timeout=30, interval=0.05, what="the job")
        found = jobs.results(job_id)["a.pdf"]
        assert provider.gets < 10  # two pages under the same token: the read stops there
    assert found.error == "unbounded_result"
    assert json.loads(job_id)["a.pdf"] in found.note and "repeated the page token" in found.note


@pytest.mark.parametrize("odd", [{"Confidence": "high"}, {"Pages": "two"}, {"Confidence": 250.0}, {"Pages": -1}])
def test_a_field_that_is_not_what_textract_documents_is_the_documents_error_naming_its_job(scans, odd):
    with TextractProvider({"scans": scans}, duration=0.1, odd_fields=odd) as provider:
        jobs = TextractJobs.connect(region_name="us-east-1", endpoint_url=provider.url)
        job_id = jobs.submit(requests("a.pdf"), "o" * 32)
        wait_for(lambda: jobs.status(job_id) == COMPLETED, timeout=30, interval=0.05, what="the job")
        found = jobs.results(job_id)["a.pdf"]
    (field,) = odd
    assert found.error == "unreadable_result" and found.answer is None
    assert json.loads(job_id)["a.pdf"] in found.note and field in found.note


def test_a_document_past_the_page_limit_is_its_error(scans):
    with TextractProvider({"scans": scans}, duration=0.1) as provider:
        jobs = TextractJobs.connect(region_name="us-east-1", endpoint_url=provider.url, max_results=1,
                                    limits=ReadLimits(pages=5))
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "p" * 32)
        wait_for(lambda: jobs.status(job_id) == COMPLETED, timeout=30, interval=0.05, what="the jobs")
        results = jobs.results(job_id)
    # a.pdf: PAGE, 2 LINEs and 5 WORDs, 8 pages of one block; b.pdf: PAGE, LINE and 2 WORDs, 4 pages
    assert (results["a.pdf"].error, "more than 5 pages" in results["a.pdf"].note) == ("unbounded_result", True)
    assert (results["b.pdf"].error, results["b.pdf"].answer["text"]) == (None, "LETTER 2")
