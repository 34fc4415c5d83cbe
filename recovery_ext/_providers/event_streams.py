"""A streamed answer (server-sent events) as its bytes say it: its events, and whether it reached its end.

An SDK reads a stream event by event and stops when the connection ends. A stream a proxy or a failing provider
ended between two events looks whole to it: every event parses, the last ones are just missing, and the SDK hands
back part of the answer without an error. What marks the end is each API's own last event, so each API is one
:class:`StreamProtocol` subclass, registered by being defined: it knows its events and its end. A stream no
protocol recognizes is not judged (an SDK or server this module does not know); a recognized one that did not
reach its end is cut off (:func:`unfinished_stream`), and the transport treats it as an unreadable answer.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from recovery_ext._providers.answer_shapes import failed_for_a_while

DONE = "[DONE]"



def event_payloads(body: bytes) -> list[str]:
    """The data of each event of a server-sent event stream: its ``data:`` lines joined by newlines, as the SSE
    standard reads them; an event still open when the stream ended is the last one."""
    payloads: list[str] = []
    lines: list[str] = []
    text = body.decode("utf-8", errors="replace")
    # only CR, LF and CRLF end a line, as the SDKs read a stream: str.splitlines() also splits at U+2028, U+2029
    # and U+0085, which JSON text may hold unescaped (a model echoing a PDF's text)
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line:
            if lines:
                payloads.append("\n".join(lines))
                lines = []
        elif line.startswith("data:"):
            data = line[5:]
            lines.append(data[1:] if data.startswith(" ") else data)
    if lines:
        payloads.append("\n".join(lines))
    return [payload.strip() for payload in payloads]


def event_values(body: bytes) -> list[Any]:
    """The JSON values of a stream's events (``[DONE]`` and data that does not parse left out)."""
    found = []
    for payload in event_payloads(body):
        if not payload or payload == DONE:
            continue
        try:
            found.append(json.loads(payload))
        except (ValueError, RecursionError):  # an event nested too deep reads as one that does not parse
            continue
    return found


# the end of an event: a blank line (a line ends at CRLF, LF or CR)
# (a CR directly followed by an LF is one CRLF, never two line ends)
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")


class _BrokenEvent(Exception):  # noqa: N818 - control flow: the transport raises an UnreadableAnswer for it
    """A whole event of a stream (ended by its blank line) whose JSON does not parse: an event cut off, then
    followed by a blank line, as a proxy that ends a stream may send."""

    def __init__(self, number: int, payload: str, why: str) -> None:
        super().__init__(f"event {number} of the stream: {why}")
        self.payload = payload


class EventGate:
    """Lets a stream's bytes through one whole event at a time, each checked first: an SDK parses an event as soon
    as its blank line arrives, and one that does not parse would reach it as a JSONDecodeError (permanent) before
    the stream ended. :meth:`feed` raises :class:`_BrokenEvent` instead, which the transport turns into an unreadable
    answer (transient: the node's retry asks again). What is left at the end (an event never ended) is checked
    with the whole stream."""

    def __init__(self) -> None:
        self.held = bytearray()  # appended in place: a long event in many chunks is not copied again each time
        self.events = 0

    def feed(self, chunk: bytes) -> bytes:
        """The bytes that may go on: the whole events ``chunk`` completes, checked."""
        # only the new bytes are searched (and the 3 before them, where a blank line may have begun): a long
        # event arriving in many chunks is not searched again from its start each time
        start = max(0, len(self.held) - 3)
        self.held += chunk
        if b"\n" not in chunk and b"\r" not in chunk:  # no line ended (most chunks of a long event)
            return b""
        ends = [m.end() for m in _EVENT_END.finditer(self.held, start)]
        if not ends:
            return b""
        whole = bytes(self.held[:ends[-1]])
        del self.held[:ends[-1]]
        for payload in event_payloads(whole):
            self.events += 1
            if payload[:1] in ("{", "[") and payload != DONE:
                try:
                    json.loads(payload)
                except (ValueError, RecursionError) as exc:
                    raise _BrokenEvent(self.events, payload, str(exc)) from None
        return whole

    def rest(self) -> bytes:
        """The bytes held back when the stream ended."""
        rest = bytes(self.held)
        self.held.clear()
        return rest


class StreamProtocol:
    """One API's event stream. A subclass is registered when it is defined. A stream is its protocol's when the
    request's path ends with ``path_end`` (a POST to the API), or else when ``recognizes`` one of its events (a
    server reached by another path); ``finished`` says its events hold the whole answer."""

    registered: ClassVar[list[type[StreamProtocol]]] = []
    name: ClassVar[str]
    path_end: ClassVar[str]
    last_event: ClassVar[str]  # what the error message names as missing

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        StreamProtocol.registered.append(cls)

    @classmethod
    def recognizes(cls, event: dict[str, Any]) -> bool:
        raise NotImplementedError

    @classmethod
    def finished(cls, events: list[dict[str, Any]], payloads: list[str]) -> bool:
        """``events``: the stream's JSON objects; ``payloads``: every event's data, as text."""
        raise NotImplementedError

    @classmethod
    def missing(cls, events: list[dict[str, Any]]) -> str:
        """What a stream that did not finish lacks, for its ledger note."""
        return f"without {cls.last_event}"


def _all_finished(choices: list[Any], reason: str) -> bool:
    """Every choice (or candidate) index seen carried ``reason`` in some event: with ``n > 1`` each event carries
    one choice, and the first to finish is not the end."""
    seen: set[Any] = set()
    ended: set[Any] = set()
    for choice in choices:
        if isinstance(choice, dict):
            index = choice.get("index", 0)
            seen.add(index)
            if choice.get(reason):
                ended.add(index)
    return bool(seen) and seen <= ended


class OpenAIChatChunks(StreamProtocol):
    """OpenAI's chat completions, and the servers compatible with it (Groq, Mistral, Together, vLLM, Ollama...):
    ``chat.completion.chunk`` events, then ``data: [DONE]``. A server that leaves ``[DONE]`` out still ends each
    choice with a ``finish_reason``, so every choice finished counts as the end too: the answer is whole. (Only
    the usage chunk may follow; a stream cut before the usage it asked for is counted at its estimate, see
    :func:`~recovery_ext._providers.http_answers.answered_call`, not asked and paid again.)"""

    name = "OpenAI chat completions"
    path_end = "/chat/completions"
    last_event = "data: [DONE] (or a finish_reason for every choice)"

    @classmethod
    def recognizes(cls, event: dict[str, Any]) -> bool:
        return event.get("object") == "chat.completion.chunk"

    @classmethod
    def finished(cls, events: list[dict[str, Any]], payloads: list[str]) -> bool:
        if DONE in payloads:
            return True
        choices = [c for e in events if isinstance(e.get("choices"), list) for c in e["choices"]]
        return _all_finished(choices, "finish_reason")


class OpenAIResponses(StreamProtocol):
    """OpenAI's responses API: ``response.*`` events, ending with the response completed, incomplete (a whole
    answer too, cut at ``max_output_tokens`` or by a content filter: the SDK reads its reason) or failed. A failure
    for the provider's own trouble (``server_error``...) is the provider's error, as an error event is, not an end:
    kept, every re-execution would replay it; one for the request (an image it cannot read) is its answer."""

    name = "OpenAI responses"
    path_end = "/responses"
    last_event = "response.completed"
    ENDS: ClassVar[frozenset[str]] = frozenset({"response.completed", "response.incomplete", "response.failed"})

    @classmethod
    def recognizes(cls, event: dict[str, Any]) -> bool:
        kind = event.get("type")
        return isinstance(kind, str) and kind.startswith("response.")

    @classmethod
    def finished(cls, events: list[dict[str, Any]], payloads: list[str]) -> bool:
        return any(event.get("type") in cls.ENDS and not failed_for_a_while(event.get("response"))
                   for event in events)

    @classmethod
    def missing(cls, events: list[dict[str, Any]]) -> str:
        for event in events:
            response = event.get("response")
            if failed_for_a_while(response):
                assert isinstance(response, dict)
                return f"ending on the provider's trouble (response.failed: {str(response.get('error'))[:80]})"
        return super().missing(events)


class AnthropicMessages(StreamProtocol):
    """Anthropic's messages: ``message_start`` to ``message_stop``. The ``message_delta`` with a ``stop_reason``
    just before it already holds the whole answer and its usage, so it counts as the end too."""

    name = "Anthropic messages"
    path_end = "/messages"
    last_event = "message_stop"
    KINDS: ClassVar[frozenset[str]] = frozenset({"message_start", "content_block_start", "content_block_delta",
                                                 "content_block_stop", "message_delta", "message_stop"})

    @classmethod
    def recognizes(cls, event: dict[str, Any]) -> bool:
        return event.get("type") in cls.KINDS

    @classmethod
    def finished(cls, events: list[dict[str, Any]], payloads: list[str]) -> bool:
        for event in events:
            delta = event.get("delta")
            if event.get("type") == "message_stop" or (
                    event.get("type") == "message_delta" and isinstance(delta, dict) and delta.get("stop_reason")):
                return True
        return False

    @classmethod
    def missing(cls, events: list[dict[str, Any]]) -> str:
        """A stream that ended on the provider's ``error`` event (overloaded, rate limited) says so by its type:
        an operator reads the provider's trouble, not a connection cut."""
        for event in reversed(events):
            error = event.get("error")
            if event.get("type") == "error" and isinstance(error, dict):
                said = str(error.get("message") or "")[:80]
                return f"ending on the provider's {str(error.get('type') or 'error')[:40]}{f': {said}' if said else ''}"
        return super().missing(events)


class GeminiCandidates(StreamProtocol):
    """Google's Gemini (``:streamGenerateContent?alt=sse``): chunks of ``candidates``, each candidate's last with a
    ``finishReason``; there is no closing event."""

    name = "Gemini"
    path_end = ":streamGenerateContent"
    last_event = "a finishReason for every candidate"

    @classmethod
    def recognizes(cls, event: dict[str, Any]) -> bool:
        return isinstance(event.get("candidates"), list)

    @classmethod
    def finished(cls, events: list[dict[str, Any]], payloads: list[str]) -> bool:
        candidates = [c for e in events if isinstance(e.get("candidates"), list) for c in e["candidates"]]
        return _all_finished(candidates, "finishReason")


def stream_protocol(path: str, events: list[Any]) -> type[StreamProtocol] | None:
    """The protocol of a stream answering a POST to ``path`` ("" when it was not a POST): by the path's end, else
    by the first event one recognizes; None: a stream this module does not know."""
    path = path.rstrip("/")
    for protocol in StreamProtocol.registered:
        if path and path.endswith(protocol.path_end):
            return protocol
    for event in events:
        if isinstance(event, dict):
            for protocol in StreamProtocol.registered:
                if protocol.recognizes(event):
                    return protocol
    return None


def unfinished_stream(payloads: list[str], events: list[Any], path: str = "") -> str | None:
    """Why a stream is cut off (its protocol's last event never came: it ended between two events, on an error
    event, or before any), or None: it reached its end, or its protocol is not known. ``payloads``: every event's
    data; ``events``: the JSON values among them; ``path``: the POST request's path ("": not known)."""
    protocol = stream_protocol(path, events)
    if protocol is None:
        return None
    objects = [e for e in events if isinstance(e, dict)]
    if protocol.finished(objects, payloads):
        return None
    return f"the {protocol.name} stream ended after {len(payloads)} events, {protocol.missing(objects)}"
