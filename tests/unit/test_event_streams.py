"""A streamed answer (server-sent events) is read as the SSE standard reads it, and one that ended inside an event
is an unreadable answer: never kept, and a kept one (from before this was checked) is asked again, not replayed."""

from __future__ import annotations

import json

import pytest

from sdk_stand_in import _anthropic_events, _openai_events

from recovery_ext._classify.classifier import classify
from recovery_ext._providers.event_streams import _BrokenEvent, EventGate
from recovery_ext._providers.http_answers import (UnreadableAnswer, answer_usage, answered_call, check_event_stream,
                                                  check_kept_answer, kept_answer, request_facts, stream_reached_end)
from recovery_ext._providers.prices import Prices

URL = "http://127.0.0.1:9/v1"
PATH = "/v1/chat/completions"
STREAMS = {"openai": _openai_events("m", "a whole answer", 12, 4),
           "anthropic": _anthropic_events("m", "a whole answer", 12, 4)}
HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


@pytest.mark.parametrize("provider", sorted(STREAMS))
def test_a_whole_stream_passes_and_its_usage_is_read(provider):
    body = "".join(STREAMS[provider]).encode()
    check_event_stream(URL, 200, body)
    check_kept_answer(URL, "", kept_answer(200, HEADERS, body))
    usage, model = answer_usage(body, streamed=True)
    assert model == "m" and usage is not None and 12 in usage.values() and 4 in usage.values()


@pytest.mark.parametrize("provider", sorted(STREAMS))
def test_a_stream_that_ends_inside_an_event_is_unreadable_and_a_kept_one_is_not_replayed(provider):
    events = STREAMS[provider]
    cut = "".join(events[:2]) + events[2][:len(events[2]) // 2]
    with pytest.raises(UnreadableAnswer, match="event 3 of the stream") as raised:
        check_event_stream(URL, 200, cut.encode())
    assert raised.value.retryable and raised.value.category == "server_error"
    assert "not kept" in raised.value.ledger_note
    with pytest.raises(UnreadableAnswer):
        check_kept_answer(URL, "", kept_answer(200, HEADERS, cut.encode()))


def test_an_event_is_its_data_lines_joined_as_the_sse_standard_reads_them():
    """One event's JSON may span two ``data:`` lines (joined by a newline); ``[DONE]`` and plain text are no JSON."""
    usage = {"prompt_tokens": 7, "completion_tokens": 2}
    body = ('data: {"model": "m",\ndata: "usage": ' + json.dumps(usage) + "}\n\n"
            "data: plain words, not JSON\n\ndata: [DONE]\n\n").encode()
    check_event_stream(URL, 200, body)
    assert answer_usage(body, streamed=True) == (usage, "m")
    with pytest.raises(UnreadableAnswer, match="event 1 of the stream"):
        check_event_stream(URL, 200, b'data: {"model": "m",\n\ndata: [DONE]\n\n')  # the event ended too soon


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"], ids=["LS", "PS", "NEL"])
def test_a_line_ends_only_at_cr_or_lf_so_json_holding_unicode_separators_is_whole(separator):
    """A review: str.splitlines() also split at these, which JSON may hold unescaped (a model echoing a PDF's
    text), so a whole answer was called unreadable, asked again and paid again."""
    text = f"one{separator}two"
    body = ("data: " + json.dumps({"model": "m", "text": text}, ensure_ascii=False) + "\n\n").encode()
    check_event_stream(URL, 200, body)
    assert answer_usage(body + b'data: {"usage": {"prompt_tokens": 3}}\n\n', streamed=True) == (
        {"prompt_tokens": 3}, "m")


# -- a stream that ended between two events, before its API's last event -------------------------------------------

def _events(*values: object) -> bytes:
    return "".join(v if isinstance(v, str) else f"data: {json.dumps(v)}\n\n" for v in values).encode()


CHUNK = {"object": "chat.completion.chunk", "model": "m"}
OPENAI_TEXT = {**CHUNK, "choices": [{"index": 0, "delta": {"content": "a whole"}, "finish_reason": None}]}
OPENAI_STOP = {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
RESPONSES_TEXT = {"type": "response.output_text.delta", "delta": "a whole"}
GEMINI_TEXT = {"candidates": [{"content": {"parts": [{"text": "a whole"}]}}], "modelVersion": "g"}
GEMINI_STOP = {"candidates": [{"content": {"parts": [{"text": " answer"}]}, "finishReason": "STOP"}]}
WHOLE = {
    "openai": _events(OPENAI_TEXT, OPENAI_STOP, "data: [DONE]\n\n"),
    "openai, a compatible server without [DONE]": _events(OPENAI_TEXT, OPENAI_STOP),
    "openai responses": _events({"type": "response.created"}, RESPONSES_TEXT, {"type": "response.completed"}),
    "openai responses, incomplete": _events({"type": "response.created"}, RESPONSES_TEXT,
                                            {"type": "response.incomplete"}),
    "openai responses, failed for its request": _events(
        {"type": "response.created"},
        {"type": "response.failed", "response": {"status": "failed", "error": {"code": "invalid_prompt"}}}),
    "anthropic": "".join(STREAMS["anthropic"]).encode(),
    "anthropic, cut after its message_delta": "".join(STREAMS["anthropic"][:-1]).encode(),
    "gemini": _events(GEMINI_TEXT, GEMINI_STOP),
    "a stream of an API not known": _events({"text": "a whole"}, {"text": " answer"}),
}
CUT_OFF = {
    "openai": _events(OPENAI_TEXT, OPENAI_TEXT),
    "openai, an error event": _events(OPENAI_TEXT, {"error": {"type": "server_error", "message": "Overloaded"}}),
    "openai responses": _events({"type": "response.created"}, RESPONSES_TEXT),
    "openai responses, failed for the provider's trouble": _events(
        {"type": "response.created"}, RESPONSES_TEXT,
        {"type": "response.failed", "response": {"status": "failed", "error": {"code": "server_error"}}}),
    "anthropic": "".join(STREAMS["anthropic"][:4]).encode(),
    "anthropic, an error event": ("".join(STREAMS["anthropic"][:3])
                                  + 'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n'
                                  ).encode(),
    "gemini": _events(GEMINI_TEXT, GEMINI_TEXT),
}


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_a_stream_that_reached_its_apis_last_event_or_of_an_api_not_known_passes(name):
    check_event_stream(URL, 200, WHOLE[name])
    check_kept_answer(URL, "", kept_answer(200, HEADERS, WHOLE[name]))


@pytest.mark.parametrize("name", sorted(CUT_OFF))
def test_a_stream_that_ended_before_its_apis_last_event_is_unreadable_and_a_kept_one_is_not_replayed(name):
    """Every event parses, so an SDK sees nothing amiss and hands back part of the answer (or raises the error
    event's error, which a journal that kept the stream replayed to every retry)."""
    ended = "ended on its error" if "error event" in name else "cut off before its end"
    with pytest.raises(UnreadableAnswer, match=ended) as raised:
        check_event_stream(URL, 200, CUT_OFF[name])
    note = raised.value.ledger_note
    assert raised.value.retryable and ("without" in note or "the provider's" in note), note
    if name == "anthropic, an error event":  # named by the provider's own error type, not as a cut connection
        assert "ending on the provider's overloaded_error" in note, note
    with pytest.raises(UnreadableAnswer):
        check_kept_answer(URL, "", kept_answer(200, HEADERS, CUT_OFF[name]))


# -- an event that does not parse is held back from the SDK ---------------------------------------------------------

@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_the_gate_lets_whole_events_through_however_the_bytes_arrive(newline):
    body = "".join(STREAMS["openai"]).replace("\n", newline).encode()
    for size in (1, 7, len(body)):
        gate = EventGate()
        passed = b"".join(gate.feed(body[i:i + size]) for i in range(0, len(body), size)) + gate.rest()
        assert passed == body
        assert gate.events == len(STREAMS["openai"])


def test_the_gate_holds_an_event_back_until_its_blank_line():
    gate = EventGate()
    first = STREAMS["anthropic"][0].encode()
    assert gate.feed(first[:-1]) == b""  # its blank line has not arrived: nothing goes on
    assert gate.feed(first[-1:]) == first


def test_an_event_cut_off_then_ended_by_a_blank_line_is_stopped_before_the_sdk_parses_it():
    """A new user's trial: the SDK parsed the half event as soon as its blank line came and raised a
    JSONDecodeError, classified permanent, so the node never asked again."""
    events = STREAMS["openai"]
    gate = EventGate()
    assert gate.feed(events[0].encode()) == events[0].encode()
    with pytest.raises(_BrokenEvent, match="event 2 of the stream"):
        gate.feed((events[1][:len(events[1]) // 2] + "\n\n").encode())


# -- a review: the stream's API by the request's path, every choice, one CRLF -------------------------------------

@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", b""),  # a proxy closing cleanly after the headers
    ("/v1/chat/completions", _events({"error": {"type": "server_error", "message": "Overloaded"}})),
    ("/v1/messages", b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n'),
    ("/v1/responses", _events({"type": "error", "code": "server_error"})),
], ids=["empty", "openai_error_only", "anthropic_error_first", "responses_error_only"])
def test_a_stream_of_a_known_api_path_with_none_of_its_events_is_cut_off(path, body):
    """A review: the API was guessed from the events only, so a stream holding none of its API's events (an error
    event first, or nothing) was kept and replayed. The request's path names the API; another path is not judged."""
    with pytest.raises(UnreadableAnswer, match="ended on its error" if b"error" in body else "cut off before its end"):
        check_event_stream(URL, 200, body, path)
    with pytest.raises(UnreadableAnswer):
        check_kept_answer(URL, path, kept_answer(200, HEADERS, body))
    check_event_stream(URL, 200, body, "")  # not a POST to an API: not judged


def test_with_n_choices_each_must_finish():
    """A review: with n > 1 each chunk carries one choice, and the first choice's finish_reason was taken for the
    end of the stream."""
    def choice(index, reason):
        return {**CHUNK, "choices": [{"index": index, "delta": {"content": "x"}, "finish_reason": reason}]}

    with pytest.raises(UnreadableAnswer, match="cut off before its end"):
        check_event_stream(URL, 200, _events(choice(0, None), choice(1, None), choice(0, "stop")), PATH)
    check_event_stream(URL, 200, _events(choice(0, None), choice(1, None), choice(0, "stop"), choice(1, "length")),
                       PATH)


def test_one_crlf_is_a_line_end_not_an_event_end():
    """A review: the gate's pattern matched one CRLF as CR then LF, so an event whose JSON spans data lines,
    arriving a line at a time, was checked half-way and refused."""
    event = b'data: {"object": "chat.completion.chunk",\r\ndata: "choices": []}\r\n\r\n'
    gate = EventGate()
    lines = event.split(b"\r\n")
    passed = b"".join(gate.feed(line + b"\r\n") for line in lines[:-1]) + gate.rest()
    assert passed == event and gate.events == 1


# -- the usage a request asked for; a stream's end whatever stopped its reader ---------------------------------------

OPENAI_USAGE = {**CHUNK, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


@pytest.mark.parametrize("body", [
    _events(OPENAI_TEXT, OPENAI_STOP),  # cut after the finish_reason: the usage chunk never came
    _events(OPENAI_TEXT, OPENAI_STOP, OPENAI_USAGE),  # a compatible server without [DONE]
    _events(OPENAI_TEXT, OPENAI_STOP, "data: [DONE]\n\n"),  # a server that ignores include_usage
], ids=["cut_before_usage", "usage_without_done", "done_without_usage"])
def test_a_stream_whose_choices_all_finished_is_whole_with_or_without_its_usage(body):
    check_event_stream(URL, 200, body, PATH)
    check_kept_answer(URL, PATH, kept_answer(200, HEADERS, body))
    assert stream_reached_end(body, PATH) is True


def test_a_stream_without_the_usage_it_asked_for_is_counted_at_its_estimate_and_priced():
    """Counted as 0 tokens, it slipped past the spend caps; asked again to learn its usage, it was paid twice."""
    prices = Prices.parse({"m": {"input": 1.0, "output": 2.0}})
    body = _events(OPENAI_TEXT, OPENAI_STOP)
    record = answered_call(URL, "m", body, streamed=True, latency=0.1, prices=prices, provider=None,
                           estimate=(30, 64))
    assert (record.tokens_in, record.tokens_out, record.outcome) == (30, 64, "ok")
    assert record.cost == prices.cost("m", 30, 64) and record.cost > 0 and "estimate" in record.note
    whole = _events(OPENAI_TEXT, OPENAI_STOP, OPENAI_USAGE)  # the usage came: it is what counts
    record = answered_call(URL, "m", whole, streamed=True, latency=0.1, prices=prices, provider=None,
                           estimate=(30, 64))
    assert (record.tokens_in, record.tokens_out, record.note) == (3, 2, None)
    unasked = answered_call(URL, "m", body, streamed=True, latency=0.1, prices=prices, provider=None)
    assert (unasked.tokens_in, unasked.tokens_out, unasked.cost) == (0, 0, None)


def test_usage_is_asked_only_by_a_stream_that_says_so():
    def asked(body: dict) -> bool:
        return request_facts("POST", URL + PATH, {}, json.dumps(body).encode(), answer_tokens=10).usage_asked

    assert asked({"stream": True, "stream_options": {"include_usage": True}})
    assert not asked({"stream": True})
    assert not asked({"stream": False, "stream_options": {"include_usage": True}})
    assert not asked({"stream": True, "stream_options": {"include_usage": "yes"}})
    assert not asked({"stream": True, "stream_options": ["include_usage"]})


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_a_whole_stream_of_a_known_api_reached_its_end_and_one_not_known_never_does(name):
    """What the tee asks when something stops a stream's reader: a whole answer of a known API is kept; of a
    stream no protocol knows, nothing says it ended."""
    assert stream_reached_end(WHOLE[name], "") is (name != "a stream of an API not known")


@pytest.mark.parametrize("name", sorted(CUT_OFF))
def test_a_cut_off_stream_never_reached_its_end(name):
    assert stream_reached_end(CUT_OFF[name], "") is False
    assert stream_reached_end(CUT_OFF[name][:len(CUT_OFF[name]) // 2], "") is False


def test_a_stream_failed_for_the_providers_trouble_says_so_in_its_note():
    """A new user's trial: its ledger note said the stream lacked response.completed, not why."""
    body = CUT_OFF["openai responses, failed for the provider's trouble"]
    with pytest.raises(UnreadableAnswer, match="provider's trouble") as raised:
        check_event_stream(URL, 200, body, "/v1/responses")
    assert "server_error" in raised.value.ledger_note


RATE_LIMITED = {
    "openai responses, failed for the provider's rate limit": (_events(
        {"type": "response.created"}, RESPONSES_TEXT,
        {"type": "response.failed", "response": {"status": "failed", "error": {"code": "rate_limit_exceeded"}}}),
        "rate_limit"),
    "anthropic, a rate limit error event": (("".join(STREAMS["anthropic"][:3])
                                             + 'event: error\ndata: {"type": "error", "error": {"type": '
                                               '"rate_limit_error"}}\n\n').encode(), "rate_limit"),
    "openai, a rate limit error event": (_events(OPENAI_TEXT, {"error": {"code": "rate_limit_exceeded"}}),
                                         "rate_limit"),
    "anthropic, an overload error event": (CUT_OFF["anthropic, an error event"], "server_error"),
    "openai, cut between two events": (CUT_OFF["openai"], "server_error"),
    "openai, a permanent error's type mid-stream": (_events(OPENAI_TEXT, {"error": {"type": "invalid_request_error"}}),
                                                    "server_error"),
}


@pytest.mark.parametrize("name", sorted(RATE_LIMITED))
def test_a_stream_ended_by_the_providers_rate_limit_is_a_rate_limit_to_the_classifier(name):
    """A trial: a stream's `response.failed` for `rate_limit_exceeded` was retried as a server error, counted
    towards the circuit breaker, without the shared rate budget's back-off a 429 gets. The error the stream ended
    on now says which: a rate limit is a rate limit; any other end is a server error, asked again as before."""
    body, category = RATE_LIMITED[name]
    with pytest.raises(UnreadableAnswer) as raised:
        check_event_stream(URL, 200, body)
    found = classify(raised.value)
    assert (found.category, found.retryable) == (category, True)
