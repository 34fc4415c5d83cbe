"""The Azure Document Intelligence adapter against the local stand-in of its wire API (through the
azure-ai-documentintelligence SDK): each document one analysis, read lazily, bounded and checked field by field;
a failed or expired analysis is an item error; a submission under a token already used starts new analyses (the
API has no idempotency key), so a submission reports each document as it goes (``submit_by_parts``) and a
resubmission re-uses those accepted; the key never leaves the client's credential."""

from __future__ import annotations

import json
import logging

import pytest

from recovery_ext import AzureDocumentJobs, ConfigurationError, ReadLimits, classify
from recovery_ext._providers.jobs import COMPLETED, EXPIRED, FAILED, RUNNING, UNFINDABLE, ResultUnreadable
from recovery_pipelines.azure_document_stand_in import STAND_IN_KEY, AzureDocumentProvider
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.sample_data import create_scanned_pdfs

DOCS = {"a.pdf": ["INVOICE 101", "Total due 11.10 EUR"], "b.pdf": ["LETTER 2"]}


@pytest.fixture
def scans(tmp_path):
    create_scanned_pdfs(tmp_path / "scans", DOCS)
    return tmp_path / "scans"


def requests(*names):
    return {name: {"urlSource": f"https://acct.blob.core.windows.net/scans/{name}"} for name in names}


def connect(provider, **options):
    return AzureDocumentJobs.connect(endpoint=provider.url, key=STAND_IN_KEY, **options)


def finished(jobs, job_id):
    wait_for(lambda: jobs.status(job_id) != RUNNING, timeout=30, interval=0.05, what="the analyses")
    return jobs.status(job_id)


def result_ids(job_id):
    return json.loads(job_id)["results"]


def test_each_document_is_one_analysis_read_when_asked_for_and_priced_per_page(scans):
    # The analyses run until the test finishes them: one on a clock could end before its RUNNING is checked.
    with AzureDocumentProvider({"scans": scans}, duration=None) as provider:
        jobs = connect(provider, price_per_page=0.0015)
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "t" * 32)
        assert provider.submissions == 2 and jobs.status(job_id) == RUNNING
        provider.finish_jobs()
        assert finished(jobs, job_id) == COMPLETED
        # status() read each succeeded result once (Azure has no status read without it) and kept it
        assert sorted(provider.results_served.values()) == [1, 1]
        gets = provider.gets
        results = jobs.results(job_id)
        first = results["a.pdf"]
        assert results["a.pdf"] is first and set(results) == {"a.pdf", "b.pdf"}
        assert provider.gets == gets  # results() took what status() read: no result was served twice
        assert sorted(provider.results_served.values()) == [1, 1]
        assert results.strays == []  # submitted once: nothing may have been paid twice
        # a second reader (a resume's adapter: nothing kept) reads each document when it is first asked for
        again = connect(provider, price_per_page=0.0015).results(job_id)
        assert provider.gets == gets  # nothing read until a document is asked for: each is kept as it is read
        assert again["a.pdf"].answer == first.answer and again["a.pdf"] is again["a.pdf"] and provider.gets == gets + 1
        assert set(again) == {"a.pdf", "b.pdf"} and provider.gets == gets + 2
    assert first.answer["text"] == "INVOICE 101\nTotal due 11.10 EUR"
    assert first.answer["lines"] == [{"text": "INVOICE 101", "page": 1}, {"text": "Total due 11.10 EUR", "page": 1}]
    assert results["b.pdf"].answer["text"] == "LETTER 2"
    assert first.answer["result_id"] == result_ids(job_id)["a.pdf"]
    assert (first.answer["pages"], first.cost, first.model) == (1, 0.0015, "prebuilt-read")
    assert 0.9 < first.answer["confidence"] <= 1


def test_a_submission_by_parts_reports_each_document_and_a_resubmission_reuses_those_accepted(scans):
    with AzureDocumentProvider({"scans": scans}, duration=0.1) as provider:
        reported: list[tuple[str, str | None]] = []
        jobs = connect(provider)
        first = jobs.submit_by_parts(requests("a.pdf"), "u" * 32, {}, lambda item, part: reported.append((item, part)))
        accepted = result_ids(first)
        # each document marked before its POST, and its resultId reported as its 202 arrived
        assert reported == [("a.pdf", None), ("a.pdf", accepted["a.pdf"])]
        resumed = connect(provider)
        assert resumed.find("u" * 32) is None  # Azure lists no analyses: nothing to re-attach to
        reported.clear()
        job_id = resumed.submit_by_parts(requests("a.pdf", "b.pdf"), "u" * 32, accepted,
                                         lambda item, part: reported.append((item, part)))
        assert provider.submissions_per_document() == {"a.pdf": 1, "b.pdf": 1}  # a.pdf re-used, not paid again
        assert result_ids(job_id)["a.pdf"] == accepted["a.pdf"]
        assert [item for item, _ in reported] == ["b.pdf", "b.pdf"]
        assert finished(resumed, job_id) == COMPLETED
        results = resumed.results(job_id)
        assert {k: r.error for k, r in results.items()} == {"a.pdf": None, "b.pdf": None}
        assert results.strays == []  # the jobs API ledgers the one part a crash may have lost, not the adapter
        with pytest.raises(ResultUnreadable, match="not a result id"):  # a recorded part is checked as a 202's
            resumed.submit_by_parts(requests("a.pdf"), "v" * 32, {"a.pdf": "../x"}, lambda item, part: None)


def test_a_group_written_before_parts_were_recorded_still_ledgers_each_document_as_maybe_paid_twice(scans):
    with AzureDocumentProvider({"scans": scans}, duration=0.1) as provider:
        jobs = connect(provider)
        group = json.loads(jobs.submit(requests("a.pdf", "b.pdf"), "u" * 32))
        job_id = json.dumps({**group, "unfound": "u" * 32})  # as the adapter wrote a resubmission's id before
        assert finished(jobs, job_id) == COMPLETED
        results = jobs.results(job_id)
        assert {k: r.error for k, r in results.items()} == {"a.pdf": None, "b.pdf": None}
    assert [s.error for s in results.strays] == [UNFINDABLE, UNFINDABLE]
    assert all("u" * 32 in s.note and "twice" in s.note for s in results.strays)
    assert "'a.pdf'" in results.strays[0].note and "'b.pdf'" in results.strays[1].note


def test_a_failed_expired_or_forgotten_analysis_is_an_item_error(scans):
    with AzureDocumentProvider({"scans": scans}, duration=0.1, fail_first={"b.pdf"}) as provider:
        jobs = connect(provider)
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "f" * 32)
        assert finished(jobs, job_id) == FAILED
        results = jobs.results(job_id)
        assert (results["a.pdf"].error, results["b.pdf"].error) == (None, "azure_failed")
        assert "InvalidRequest: Invalid request." in results["b.pdf"].note
        assert result_ids(job_id)["b.pdf"] in results["b.pdf"].note
        provider.forget(result_ids(job_id)["a.pdf"])
        fresh = connect(provider)
        gone = fresh.results(job_id)["a.pdf"]
        assert gone.error == "job_gone" and "404" in gone.note
        only_a = json.dumps({"model": "prebuilt-read", "results": {"a.pdf": result_ids(job_id)["a.pdf"]}})
        assert fresh.status(only_a) == EXPIRED


def test_a_result_past_its_retention_is_gone(scans):
    with AzureDocumentProvider({"scans": scans}, duration=0.05, retention=0.0) as provider:
        jobs = connect(provider)
        job_id = jobs.submit(requests("a.pdf"), "g" * 32)
        wait_for(lambda: provider.charged(), timeout=30, interval=0.05, what="the analysis")
        assert jobs.status(job_id) == EXPIRED
        assert jobs.results(job_id)["a.pdf"].error == "job_gone"


@pytest.mark.parametrize("odd", [{"confidence": "high"}, {"confidence": 1.5}, {"pageNumber": "one"},
                                 {"content": 7}, {"pages": {"1": {}}}, {"status": "done"},
                                 {"analyzeResult": ["not", "an", "object"]}])
def test_a_field_that_is_not_what_azure_documents_is_the_documents_error_naming_its_analysis(scans, odd):
    with AzureDocumentProvider({"scans": scans}, duration=0.05, malformed=odd) as provider:
        jobs = connect(provider)
        job_id = jobs.submit(requests("a.pdf"), "o" * 32)
        wait_for(lambda: provider.charged(), timeout=30, interval=0.05, what="the analysis")
        assert jobs.status(job_id) == COMPLETED  # it ended; reading it says what is wrong
        found = jobs.results(job_id)["a.pdf"]
    (field,) = odd
    assert found.error == "unreadable_result" and found.answer is None
    assert result_ids(job_id)["a.pdf"] in found.note and field in found.note


def test_a_result_past_the_byte_limit_is_its_error(scans):
    with AzureDocumentProvider({"scans": scans}, duration=0.05) as provider:
        jobs = connect(provider, limits=ReadLimits(bytes=850))
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "p" * 32)
        assert finished(jobs, job_id) == COMPLETED
        results = jobs.results(job_id)
    # a.pdf's operation is about 1000 bytes, b.pdf's about 700
    assert (results["a.pdf"].error, "more than 850 bytes" in results["a.pdf"].note) == ("unbounded_result", True)
    assert (results["b.pdf"].error, results["b.pdf"].answer["text"]) == (None, "LETTER 2")


def test_what_status_keeps_for_results_is_bounded_by_one_documents_byte_limit(scans):
    # Both finish before the first status read, which reads them in the group's order: a.pdf first.
    with AzureDocumentProvider({"scans": scans}, duration=None) as provider:
        jobs = connect(provider, limits=ReadLimits(bytes=1500))
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "k" * 32)
        provider.finish_jobs()
        assert jobs.status(job_id) == COMPLETED
        results = jobs.results(job_id)
        assert {k: r.error for k, r in results.items()} == {"a.pdf": None, "b.pdf": None}
        served = {name: provider.results_served[result_id] for name, result_id in result_ids(job_id).items()}
    # a.pdf's operation (about 1300 bytes) was kept; b.pdf's (about 700) would have gone past 1500: read again
    assert served == {"a.pdf": 1, "b.pdf": 2}


def test_the_key_never_reaches_a_log_an_error_an_id_or_a_result(scans, caplog):
    caplog.set_level(logging.DEBUG)  # azure-core's HTTP logging, urllib3's, ours: everything
    with AzureDocumentProvider({"scans": scans}, duration=0.05, fail_first={"b.pdf"}) as provider:
        jobs = connect(provider, price_per_page=0.001)
        job_id = jobs.submit(requests("a.pdf", "b.pdf"), "k" * 32)
        finished(jobs, job_id)
        results = dict(jobs.results(job_id))
        wrong = AzureDocumentJobs.connect(endpoint=provider.url, key="not-the-" + STAND_IN_KEY)
        with pytest.raises(Exception) as denied:
            wrong.submit(requests("a.pdf"), "w" * 32)
        with pytest.raises(Exception) as missing:
            jobs.submit(requests("nope.pdf"), "m" * 32)
        assert STAND_IN_KEY in provider.keys_seen  # it was sent, in its header, to the service only
    assert not classify(denied.value).retryable and classify(denied.value).category == "auth"
    assert not classify(missing.value).retryable
    shown = [caplog.text, str(denied.value), repr(denied.value), str(missing.value), job_id, repr(results),
             repr(vars(jobs)), jobs.endpoint]
    assert "Ocp-Apim-Subscription-Key" in caplog.text  # the header was logged, redacted
    assert not [text for text in shown if STAND_IN_KEY in text]


def test_what_it_is_given_is_checked_before_anything_is_sent(scans):
    with AzureDocumentProvider({"scans": scans}) as provider:
        jobs = connect(provider)
        with pytest.raises(ConfigurationError, match="'x'"):
            jobs.submit({"x": "https://not-a-request"}, "c" * 32)
        assert provider.submissions == 0 and provider.creates == 0
        with pytest.raises(ConfigurationError):
            AzureDocumentJobs(jobs.client, model_id="no model/id")
        with pytest.raises(ConfigurationError):
            AzureDocumentJobs.connect(endpoint=provider.url)  # neither a key nor a credential
