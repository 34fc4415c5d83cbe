"""The Gemini batch mode adapter against the local stand-in of the Gemini API's wire protocol, through the
``google-genai`` SDK: a batch orphaned before its name was recorded is found by its display name; each line of the
responses file comes back by item, and a line that does not parse, a failed request and a batch the API no
longer knows cost their own items; a responses file past the byte limit is not downloaded."""

from __future__ import annotations

from google import genai
from google.genai import types

from recovery_ext import GeminiBatchJobs, ReadLimits
from recovery_ext._providers.jobs import COMPLETED, EXPIRED, RUNNING
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.gemini_batch_stand_in import GeminiBatchProvider


def requests(*keys: str) -> dict:
    return {key: {"contents": [{"role": "user", "parts": [{"text": key}]}]} for key in keys}


def adapter(provider: GeminiBatchProvider, **options) -> GeminiBatchJobs:
    client = genai.Client(api_key="stand-in", http_options=types.HttpOptions(base_url=provider.url))
    return GeminiBatchJobs(client, model="gemini-2.5-flash", base_url=provider.url, **options)


def test_a_batch_is_found_by_its_token_and_answers_by_item():
    # in progress until the test says so: a fixed duration can run out before the first status on a busy machine
    with GeminiBatchProvider(duration=600.0, fail_first=2) as provider:
        jobs = adapter(provider)
        name = jobs.submit(requests("a", "b", "c"), "token1")
        assert adapter(provider).find("token1") == name  # a resume whose crash came before the name was kept
        assert adapter(provider).find("token2") is None
        assert jobs.status(name) == RUNNING
        provider.duration = 0.0  # the job ends at its next status
        wait_for(lambda: jobs.status(name) != RUNNING, timeout=30, interval=0.05, what="the batch")
        assert jobs.status(name) == COMPLETED
        results = jobs.results(name)
        answered = {key: (i, o) for key, i, o in provider.answered()}
    assert results["a"].answer["candidates"][0]["content"]["parts"][0]["text"] == "a description of a"
    assert (results["a"].tokens_in, results["a"].tokens_out) == answered["a"]
    assert results["c"].error == "gemini_internal" and "Internal error" in results["c"].note and name in \
        results["c"].note
    assert provider.submissions == 1


def test_an_unreadable_line_a_forgotten_batch_and_a_file_past_the_limit():
    with GeminiBatchProvider(duration=0.1) as provider:
        jobs = adapter(provider)
        name = jobs.submit(requests("a", "b"), "token3")
        wait_for(lambda: jobs.status(name) == COMPLETED, timeout=30, interval=0.05, what="the batch")
        (out,) = [n for n in provider.files if n.startswith("files/out")]
        lines = provider.files[out].decode().splitlines()
        provider.files[out] = "\n".join([lines[0][:30], "[]", lines[1]]).encode()
        results = jobs.results(name)
        assert sorted((key, r.error) for key, r in results.items()) == [("a", "unreadable_result"), ("b", None)]
        assert [r.error for r in results.strays] == ["unreadable_result"]
        small = adapter(provider, limits=ReadLimits(bytes=10)).results(name)
        assert dict(small) == {} and small.absent.error == "unbounded_result" and out in small.absent.note
        provider.forget(name)
        gone = adapter(provider)
        assert gone.status(name) == EXPIRED and gone.results(name).absent.error == "job_gone"
