"""A 2xx answer that is not its API's answer (the provider's error with a 200, JSON without the answer's list, an
HTML page) is an unreadable answer: never kept, asked again; a kept one (from before this was checked) is not
replayed. An API not listed is not judged."""

from __future__ import annotations

import json

import pytest

from recovery_ext._classify.classifier import classify
from recovery_ext._providers.answer_shapes import shape_problem
from recovery_ext._providers.http_answers import UnreadableAnswer, check_answer, check_kept_answer, kept_answer

URL = "http://127.0.0.1:9/v1"
JSON = {"content-type": "application/json"}
WHOLE = [
    ("/v1/chat/completions", {"choices": [{"message": {"content": "a"}}]}),
    ("/v1/chat/completions/", {"choices": [{"finish_reason": "content_filter"}]}),
    ("/v1/messages", {"type": "message", "content": []}),  # a refusal or an empty answer
    ("/v1/responses", {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []}),
    # failed for its request: asked again, it fails the same
    ("/v1/responses", {"status": "failed", "error": {"code": "invalid_image"}, "output": []}),
    ("/v1/embeddings", {"data": [{"embedding": [0.1]}]}),
    ("/v1/messages/count_tokens", {"input_tokens": 3}),  # not a messages answer
    ("/v1beta/models/g:generateContent", {"promptFeedback": {"blockReason": "SAFETY"}}),  # not listed
]
NOT_ANSWERS = [
    ("/v1/chat/completions", {"error": {"message": "Overloaded"}}, "the provider's error, not a chat completion"),
    ("/v1/chat/completions", {"id": "x"}, "a chat completion without its choices list"),
    ("/v1/chat/completions", {"id": "x", "choices": []}, "a chat completion with an empty choices list"),
    ("/v1/chat/completions", ["not", "an", "object"], "without its choices list"),
    ("/v1/messages", {"type": "error", "error": {"type": "overloaded_error"}}, "the provider's error, not a message"),
    ("/v1/responses", {"id": "r"}, "a response without its output list"),
    ("/v1/responses", {"status": "failed", "error": {"code": "server_error"}, "output": []},
     "a response failed for the provider's trouble"),
    ("/v1/responses", {"status": "failed", "error": None, "output": []},
     "a response failed for the provider's trouble"),
    ("/v1/embeddings", {"data": None}, "embeddings without its data list"),
]


@pytest.mark.parametrize(("path", "value"), WHOLE)
def test_a_whole_answer_or_an_api_not_listed_passes(path, value):
    assert shape_problem(path, value) is None
    body = json.dumps(value).encode()
    assert check_answer(URL, path, 200, JSON, body) == value
    check_kept_answer(URL, path, kept_answer(200, JSON, body))


@pytest.mark.parametrize(("path", "value", "why"), NOT_ANSWERS)
def test_json_that_is_not_the_apis_answer_is_unreadable_and_a_kept_one_is_not_replayed(path, value, why):
    assert why in shape_problem(path, value)
    body = json.dumps(value).encode()
    with pytest.raises(UnreadableAnswer, match="not the API's answer") as raised:
        check_answer(URL, path, 200, JSON, body)
    assert raised.value.retryable and why in raised.value.ledger_note
    with pytest.raises(UnreadableAnswer):
        check_kept_answer(URL, path, kept_answer(200, JSON, body))


def test_an_html_page_with_a_200_is_unreadable_and_a_refusal_is_left_to_the_sdk():
    page = b"<html><body>502 Bad Gateway</body></html>"
    with pytest.raises(UnreadableAnswer, match="HTML"):
        check_answer(URL, "/v1/anything", 200, {"content-type": "text/html; charset=utf-8"}, page)
    # not an answer at all: the SDK raises its own error for a 4xx or 5xx, whatever the body
    check_answer(URL, "/v1/chat/completions", 502, {"content-type": "text/html"}, page)
    check_answer(URL, "/v1/chat/completions", 400, JSON, b'{"error": {"message": "bad"}}')


@pytest.mark.parametrize(("path", "value"), [
    ("/v1/chat/completions", {"object": "list", "data": []}),  # a list's page (its GET), by its own shape
    ("/api/embeddings", {"embedding": [0.1]}),  # Ollama's own API, not OpenAI's
])
def test_a_list_or_another_apis_answer_is_not_judged(path, value):
    """A review: the path alone refused `client.chat.completions.list()` and Ollama's embeddings."""
    assert shape_problem(path, value) is None


def test_a_request_that_is_not_a_post_is_not_judged():
    """The transport passes an API path only for a POST: a GET's answer (a stored file's HTML too) is the SDK's."""
    assert check_answer(URL, "", 200, JSON, b'{"error": {"message": "x"}}') == {"error": {"message": "x"}}
    check_answer(URL, "", 200, {"content-type": "text/html"}, b"<html></html>")


@pytest.mark.parametrize(("path", "value", "category"), [
    ("/v1/responses", {"status": "failed", "error": {"code": "rate_limit_exceeded"}, "output": []}, "rate_limit"),
    ("/v1/messages", {"type": "error", "error": {"type": "rate_limit_error"}}, "rate_limit"),
    ("/v1/messages", {"type": "error", "error": {"type": "overloaded_error"}}, "server_error"),
    ("/v1/chat/completions", {"error": {"message": "Overloaded"}}, "server_error"),
])
def test_the_providers_rate_limit_with_a_200_is_a_rate_limit_to_the_classifier(path, value, category):
    """A failed response for `rate_limit_exceeded` was retried as a server error (counted towards the breaker,
    without the shared back-off a 429 gets); its own error now says it is a rate limit."""
    with pytest.raises(UnreadableAnswer) as raised:
        check_answer(URL, path, 200, JSON, json.dumps(value).encode())
    found = classify(raised.value)
    assert (found.category, found.retryable) == (category, True)


class _Spend:
    """A spend cap reservation that says how it was settled."""

    def __init__(self) -> None:
        self.settled: list[str] = []

    def settle_estimate(self) -> None:
        self.settled.append("estimate")

    def release(self) -> None:
        self.settled.append("released")


@pytest.mark.parametrize(("path", "value", "settled"), [
    ("/v1/responses", {"status": "failed", "error": {"code": "rate_limit_exceeded"}, "output": []}, "released"),
    ("/v1/messages", {"type": "error", "error": {"type": "rate_limit_error"}}, "released"),
    ("/v1/messages", {"type": "error", "error": {"type": "overloaded_error"}}, "estimate"),
    ("/v1/chat/completions", {"id": "x"}, "estimate"),
])
def test_a_rate_limits_refusal_with_a_200_gives_the_spend_cap_its_room_back(path, value, settled):
    """A trial: 39 rate-limit refusals answered with a 200 were each charged their estimate to the spend cap (4,010
    tokens against the ledger's 1,670). A refusal is not billed, as a 429 is not; another unreadable 2xx answer
    probably was, and still counts at its estimate."""
    from recovery_ext._providers.guard import AttemptHold

    with pytest.raises(UnreadableAnswer) as raised:
        check_answer(URL, path, 200, JSON, json.dumps(value).encode())
    spend = _Spend()
    AttemptHold(None, spend, print).spent_unknown(raised.value)
    assert spend.settled == [settled]
