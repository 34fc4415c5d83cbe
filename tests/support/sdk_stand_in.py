"""A stand-in for OpenAI's chat completions and Anthropic's messages on 127.0.0.1, for the real SDKs.

It answers JSON or a server-sent event stream (``"stream": true``) in each API's own shapes, with usage: a token per
4 characters of the request's messages, and of the answer. It counts every request. ``script`` is a list of statuses
the next requests get instead of an answer (a 503 then a 200: ``[503]``), with ``Retry-After: retry_after`` (a
number, or a string sent as it is: an HTTP date, garbage), or
``"truncated"``: a 200 ``application/json`` whose body is cut off mid-answer (a whole, well-framed HTTP message:
only its JSON is broken), or for a streamed request an event stream that ends inside its second text event (the
stream's chunked framing ends cleanly); for a streamed request also ``"cut_between_events"`` (the stream ends
cleanly after its second text event, without the events that end an answer), ``"error_event"`` (an error event after
the first text event, as a provider overloaded mid-answer sends), ``"cut_then_blank_line"`` (cut inside its second
text event, then a blank line), ``"corrupt_gzip"`` (said to be gzip: a gzip header, then plain events) or
``"cut_before_usage"`` (an OpenAI stream that ends after its ``finish_reason``, before the usage chunk and
``[DONE]``); ``slow_tail``: seconds a stream stays open after its last event; ``reset_tail``: a stream's connection
closed after its last event, before the chunked body's end;
``gzip_streams``: every stream gzip-encoded; ``tokens``/``window`` is a token quota over a sliding window, refused
with a 429 and Retry-After as providers do (a refused request charges nothing).
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Request:
    at: float
    path: str
    status: int
    streamed: bool
    tokens_in: int
    tokens_out: int
    question: str
    truncated: bool = False


def _question(body: dict) -> str:
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content", "")
    return content if isinstance(content, str) else json.dumps(content)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # listen() backlog: 64 clients connecting at once are all accepted. With socketserver's default of 5 the
    # kernel drops the handshakes of the rest, and some of those clients read a reset (httpx's ReadError) on a
    # request the stand-in never saw: three at once opened the circuit breaker in bench/tpm_bench.py.
    request_queue_size = 512


class SdkStandIn:
    def __init__(self, *, latency: float = 0.0, tokens: int | None = None, window: float = 60.0,
                 retry_after: float | str = 0.1) -> None:
        self.latency, self.quota_tokens, self.window, self.retry_after = latency, tokens, window, retry_after
        self.script: list[int | str] = []
        self.gzip_streams = False  # True: every event stream gzip-encoded, flushed event by event as a proxy does
        # seconds a stream's connection stays open after its last event, before the chunked body's end (a proxy or
        # a busy server that is slow to close: the OpenAI async SDK drains that tail for 0.1 s only, then cancels)
        self.slow_tail = 0.0
        # True: a stream's connection is closed after its last event, without the chunked body's end (a proxy
        # that resets it): the client reads "incomplete chunked read"
        self.reset_tail = False
        self.no_usage = False  # True: OpenAI answers without usage (no `usage` field, no usage chunk in a stream)
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def answered(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.status == 200 and not r.truncated]

    def truncated(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.truncated]

    def statuses(self) -> list[int]:
        with self.lock:
            return [r.status for r in self.requests]

    def max_tokens_in_window(self) -> int:
        answered = sorted(self.answered(), key=lambda r: r.at)
        return max((sum(r.tokens_in + r.tokens_out for r in answered[i:] if r.at < first.at + self.window)
                    for i, first in enumerate(answered)), default=0)

    def _admit(self, now: float, tokens: int) -> int | str:
        """200, or the status (or "truncated") a scripted fault or the quota answers instead."""
        if self.script:
            return self.script.pop(0)
        if self.quota_tokens is not None:
            spent = sum(r.tokens_in + r.tokens_out for r in self.requests
                        if r.status == 200 and r.at > now - self.window)
            if spent + tokens > self.quota_tokens:
                return 429
        return 200

    def start(self) -> str:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw or b"{}")
                question = _question(body)
                answer = f"answer to {question}"[:200]
                tokens_in = len(json.dumps(body.get("messages", []))) // 4 + 1
                tokens_out = len(answer) // 4 + 1
                streamed = body.get("stream") is True
                if stand_in.latency:
                    time.sleep(stand_in.latency)
                with stand_in.lock:
                    now = time.time()
                    fault = stand_in._admit(now, tokens_in + tokens_out)
                    truncated = fault in CUT_OFF
                    status = 200 if truncated else int(fault)
                    stand_in.requests.append(Request(now, self.path, status, streamed,
                                                     tokens_in if status == 200 and not truncated else 0,
                                                     tokens_out if status == 200 and not truncated else 0, question,
                                                     truncated))
                if fault == "corrupt_gzip" and streamed:  # said to be gzip, and not gzip past its header
                    self._send_events(_cut_off_events("truncated", self.path.endswith("/messages"), answer),
                                      gzip_header=True)
                    return
                if truncated and streamed:
                    self._send_events(_cut_off_events(fault, self.path.endswith("/messages"), answer))
                    return
                if truncated:  # a well-framed 200 all the same
                    media, data, encoding = BAD_ANSWERS.get(fault, BAD_ANSWERS["truncated"])
                    self.send_response(200)
                    self.send_header("Content-Type", media)
                    if encoding:
                        self.send_header("Content-Encoding", encoding)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if status != 200:
                    self._send(status, {"error": {"type": "rate_limit_error" if status == 429 else "overloaded",
                                                  "message": f"stand-in says {status}"}},
                               {"Retry-After": stand_in.retry_after if isinstance(stand_in.retry_after, str)
                                else f"{stand_in.retry_after:g}"})
                    return
                anthropic = self.path.endswith("/messages")
                model = body.get("model", "m")
                if not streamed:
                    payload = _anthropic(model, answer, tokens_in, tokens_out) if anthropic \
                        else _openai(model, answer, tokens_in, tokens_out)
                    if stand_in.no_usage and not anthropic:
                        del payload["usage"]
                    self._send(200, payload)
                    return
                events = _anthropic_events(model, answer, tokens_in, tokens_out) if anthropic \
                    else _openai_events(model, answer, tokens_in, tokens_out)
                if stand_in.no_usage and not anthropic:
                    events = [event for event in events if '"usage"' not in event]
                self._send_events(events)

            def _send_events(self, events: list[str], *, gzip_header: bool = False) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                compressed = stand_in.gzip_streams and not gzip_header
                if gzip_header or compressed:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                gzip = zlib.compressobj(wbits=31)
                for number, event in enumerate(events):
                    data = event.encode()
                    if compressed:
                        data = gzip.compress(data) + gzip.flush(zlib.Z_SYNC_FLUSH)
                    elif gzip_header and number == 0:  # a gzip header, then plain text
                        data = b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + data
                    self._chunk(data)
                if compressed:
                    self._chunk(gzip.flush())
                if stand_in.slow_tail:
                    time.sleep(stand_in.slow_tail)
                if stand_in.reset_tail:
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-request-id", f"req-{len(stand_in.requests)}")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _openai(model: str, answer: str, tokens_in: int, tokens_out: int) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                      "total_tokens": tokens_in + tokens_out, "prompt_tokens_details": {"cached_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0}}}


def _anthropic(model: str, answer: str, tokens_in: int, tokens_out: int) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": answer}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0}}


def _sse(data: dict, event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"


def _openai_events(model: str, answer: str, tokens_in: int, tokens_out: int) -> list[str]:
    half = len(answer) // 2
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model}
    return [_sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": part},
                                        "finish_reason": None}]}) for part in (answer[:half], answer[half:])] + [
        _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        _sse({**chunk, "choices": [], "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                                                "total_tokens": tokens_in + tokens_out}}),
        "data: [DONE]\n\n"]


def _anthropic_events(model: str, answer: str, tokens_in: int, tokens_out: int) -> list[str]:
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                                                  "content": [], "stop_reason": None, "stop_sequence": None,
                                                  "usage": {"input_tokens": tokens_in, "output_tokens": 1}}}
    half = len(answer) // 2
    return [_sse(start, "message_start"),
            _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                 "content_block_start"),
            *[_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}},
                   "content_block_delta") for part in (answer[:half], answer[half:])],
            _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            _sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                  "usage": {"output_tokens": tokens_out}}, "message_delta"),
            _sse({"type": "message_stop"}, "message_stop")]


# The ways a streamed answer is cut off: inside its second text event; cleanly after it, before the events that
# end the answer; by an error event after the first text event (a provider overloaded mid-answer).
CUT_OFF = ("truncated", "cut_then_blank_line", "cut_between_events", "error_event", "corrupt_gzip", "error_200",
           "no_answer_list", "html_200", "cut_before_usage")
# A non-streamed request's 200 that is no answer: its content type, body and content encoding. "truncated": the
# user trial's body, cut off inside a string; the provider's error with a 200; JSON without the answer's list (no
# `choices`, no `content`); a proxy's HTML page; a gzip header, then plain text.
BAD_ANSWERS = {
    "truncated": ("application/json", b'{"id": "x", "choices": [ {"mess', None),
    "error_200": ("application/json", b'{"error": {"type": "server_error", "message": "Overloaded"}}', None),
    "no_answer_list": ("application/json", b'{"id": "x", "model": "m"}', None),
    "html_200": ("text/html; charset=utf-8", b"<html><body>502 Bad Gateway</body></html>", None),
    "corrupt_gzip": ("application/json", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xff\xffnot gzip", "gzip"),
}


def _cut_off_events(fault: str, anthropic: bool, answer: str) -> list[str]:
    events = _anthropic_events("m", answer, 0, 0) if anthropic else _openai_events("m", answer, 0, 0)
    second_text = 3 if anthropic else 1
    if fault in ("truncated", "cut_then_blank_line"):  # the second: an SDK parses the half event (a blank line)
        cut = events[second_text][:len(events[second_text]) // 2]
        return events[:second_text] + [cut + ("\n\n" if fault == "cut_then_blank_line" else "")]
    if fault == "cut_between_events":
        return events[:second_text + 1]
    if fault == "cut_before_usage":  # OpenAI's: every choice finished, then nothing (include_usage was asked)
        assert not anthropic, "cut_before_usage is an OpenAI stream's fault"
        return events[:second_text + 2]
    error = {"type": "overloaded_error", "message": "Overloaded"}
    return events[:second_text] + [_sse({"type": "error", "error": error}, "error") if anthropic
                                   else _sse({"error": {**error, "type": "server_error"}})]
