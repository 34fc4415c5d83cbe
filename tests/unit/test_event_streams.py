"""A streamed answer (server-sent events) is read as the SSE standard reads it, and one that ended inside an event
is an unreadable answer: never kept, and a kept one (from before this was checked) is asked again, not replayed."""

from __future__ import annotations

import json

import pytest

from sdk_stand_in import _anthropic_events, _openai_events

from recovery_ext._providers.http_answers import (UnreadableAnswer, answer_usage, check_event_stream,
                                                  check_kept_answer, kept_answer)

URL = "http://127.0.0.1:9/v1"
STREAMS = {"openai": _openai_events("m", "a whole answer", 12, 4),
           "anthropic": _anthropic_events("m", "a whole answer", 12, 4)}
HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


@pytest.mark.parametrize("provider", sorted(STREAMS))
def test_a_whole_stream_passes_and_its_usage_is_read(provider):
    body = "".join(STREAMS[provider]).encode()
    check_event_stream(URL, 200, body)
    check_kept_answer(URL, kept_answer(200, HEADERS, body))
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
        check_kept_answer(URL, kept_answer(200, HEADERS, cut.encode()))


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
