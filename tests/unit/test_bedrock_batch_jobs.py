"""The Bedrock batch inference adapter against the local stand-in of Bedrock's and S3's wire APIs, through botocore:
a creation repeated under the job's token starts nothing, each record's answer comes back by item, and a
record Bedrock failed, a line that does not parse and a job Bedrock no longer knows cost their own items."""

from __future__ import annotations

import pytest

from recovery_ext import BedrockBatchJobs, ConfigurationError
from recovery_ext._providers.jobs import COMPLETED, EXPIRED, RUNNING
from recovery_pipelines.bedrock_batch_stand_in import BedrockBatchProvider
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.textract_stand_in import STAND_IN_CREDENTIALS

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
ROLE = "arn:aws:iam::000000000000:role/batch"


@pytest.fixture(autouse=True)
def credentials(monkeypatch):
    for name, value in STAND_IN_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


def requests(*keys: str) -> dict:
    return {key: {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                  "messages": [{"role": "user", "content": key}]} for key in keys}


def adapter(provider: BedrockBatchProvider) -> BedrockBatchJobs:
    return BedrockBatchJobs.connect(region_name="us-east-1", endpoint_url=provider.url, s3_endpoint_url=provider.url,
                                    model_id=MODEL, role_arn=ROLE, input_uri="s3://batches/in",
                                    output_uri="s3://batches/out")


def test_a_job_under_its_token_is_started_once_and_answers_by_item():
    # in progress until the test says so: a fixed duration ran out before the first status on a busy machine
    with BedrockBatchProvider(duration=600.0, fail_first=2) as provider:
        jobs = adapter(provider)
        arn = jobs.submit(requests("a", "b", "c"), "token1")
        assert adapter(provider).submit(requests("a", "b", "c"), "token1") == arn  # a resume's submission
        assert (provider.submissions, provider.creates) == (1, 2)
        assert jobs.status(arn) == RUNNING
        provider.duration = 0.0  # the job ends at its next status
        wait_for(lambda: jobs.status(arn) != RUNNING, timeout=30, interval=0.05, what="the job")
        assert jobs.status(arn) == COMPLETED  # PartiallyCompleted: the failed records are item errors
        results = jobs.results(arn)
        answered = {rid: (i, o) for rid, i, o in provider.answered()}
    assert results["a"].answer["content"][0]["text"] == "a description of a"
    assert (results["a"].tokens_in, results["a"].tokens_out) in answered.values()
    assert results["c"].error == "bedrock_500" and "Internal server error" in results["c"].note
    assert arn in results["c"].note and sorted(results) == ["a", "b", "c"]


def test_a_line_that_does_not_parse_and_a_job_bedrock_no_longer_knows():
    with BedrockBatchProvider(duration=0.1) as provider:
        jobs = adapter(provider)
        arn = jobs.submit(requests("a", "b"), "token2")
        wait_for(lambda: jobs.status(arn) == COMPLETED, timeout=30, interval=0.05, what="the job")
        (out,) = [k for k in provider.objects if k[1].endswith(".out")]
        lines = provider.objects[out].decode().splitlines()
        provider.objects[out] = "\n".join([lines[0][:40], "[]", lines[1]]).encode()
        results = jobs.results(arn)
        assert sorted((key, r.error) for key, r in results.items()) == [("a", "unreadable_result"), ("b", None)]
        assert arn in results["a"].note  # the cut line named its record: only that item is redone
        assert [r.error for r in results.strays] == ["unreadable_result"]  # `[]` names none: ledgered
        provider.forget(arn)
        gone = adapter(provider)
        assert gone.status(arn) == EXPIRED and gone.results(arn).absent.error == "job_gone"


def test_the_locations_must_be_s3_uris(credentials):
    with pytest.raises(ConfigurationError):
        BedrockBatchJobs(object(), object(), model_id=MODEL, role_arn=ROLE, input_uri="/tmp/in",
                         output_uri="s3://b/out")
