"""What an HTTP request to a provider is (its journal key, model, token estimate) and what its answer says
(usage, model), read from the bytes an SDK sends and receives, whatever the SDK.

Usage is read in the two shapes the LLM APIs use: OpenAI's ``prompt_tokens``/``completion_tokens`` (chat
completions, and Groq, Mistral, Together and other compatible servers) and ``input_tokens``/``output_tokens``
(Anthropic's messages, OpenAI's responses). Anthropic counts cache reads and writes apart from
``input_tokens``; they are input the provider bills, so they are added to it (OpenAI's ``prompt_tokens``
already holds its cached tokens). A streamed answer (server-sent events) carries its usage in its events:
OpenAI's last chunk (with ``stream_options.include_usage``), Anthropic's ``message_start`` and
``message_delta``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import Any

from recovery_ext._classify.classifier import ClassifiedError
from recovery_ext._classify.families.llm_errors import PROVIDER_ERROR_TYPES, error_object_type
from recovery_ext._classify.redaction import redact
from recovery_ext._providers.answer_shapes import shape_problem
from recovery_ext._providers.event_streams import (DONE, event_payloads, event_values, stream_protocol,
                                                   unfinished_stream)
from recovery_ext._providers.jobs import UNREADABLE_RESULT
from recovery_ext._providers.journal import fingerprint
from recovery_ext._providers.prices import Prices
from recovery_ext._providers.usage import read_usage, token_count
from recovery_ext._store.models import ProviderCall

# The answer headers a replay gives back: the body's type and the provider's request ids (SDKs show them).
KEPT_HEADERS = ("content-type", "x-request-id", "request-id", "openai-model", "anthropic-organization-id")
IDEMPOTENCY_HEADER = "idempotency-key"
# Stainless-generated SDKs may send a random key per call (a new one in every process): not a stable key.
RANDOM_KEY_PREFIX = "stainless-python-retry-"
ANTHROPIC_CACHE_FIELDS = ("cache_read_input_tokens", "cache_creation_input_tokens")
CUT_BEFORE_USAGE = "the stream ended without the usage it asked for: counted at its estimate"
# the ledger says what the provider said (nothing); a spend cap counts the call at its estimate all the same
NO_USAGE = "the answer held no usage: recorded as 0 tokens"


@dataclass(frozen=True)
class RequestFacts:
    """One request as the journal and the budget see it."""

    key: str | None          # the caller's idempotency key, when it sent a stable one
    fingerprinted: str       # else: method, URL and body, hashed
    model: str | None
    estimated_tokens: int    # an upper bound: the body at 3 characters a token plus the most the answer may hold
    streamed: bool
    api_path: str = ""       # a POST's path (an API call, its answer judged by its API's shape); "": not a POST
    usage_asked: bool = False  # a stream asked to end with its usage (OpenAI's stream_options.include_usage)
    answer_bound: int = 0    # the most the answer may hold, in tokens (part of estimated_tokens)


def request_facts(method: str, url: str, headers: Any, body: bytes, *, answer_tokens: int) -> RequestFacts:
    """The facts of a request; ``answer_tokens`` bounds the answer when the body does not say (``max_tokens``)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        model = data.get("model") if isinstance(data.get("model"), str) else None
        most = next((data[k] for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                     if isinstance(data.get(k), int) and not isinstance(data.get(k), bool)), None)
        streamed = data.get("stream") is True
        options = data.get("stream_options")
        usage_asked = streamed and isinstance(options, dict) and options.get("include_usage") is True
    else:
        model, most, streamed, usage_asked = None, None, False, False
    shown: Any = data if data is not None else {"sha256": hashlib.sha256(body).hexdigest()}
    found = fingerprint("http", method.upper(), url, shown)
    if found is None:  # a body with a NaN in it: hashed as bytes
        found = fingerprint("http", method.upper(), url, {"sha256": hashlib.sha256(body).hexdigest()})
    assert found is not None
    key = headers.get(IDEMPOTENCY_HEADER)
    if key is not None and (key.startswith(RANDOM_KEY_PREFIX) or not 0 < len(key) <= 200):
        key = None
    bound = max(0, most if most is not None else answer_tokens)
    estimate = len(body) // 3 + 8 + bound
    api_path = urlsplit(url).path if method.upper() == "POST" else ""
    return RequestFacts(key, found, model, max(0, estimate), streamed, api_path, usage_asked, bound)


def is_event_stream(headers: Any) -> bool:
    return _media_type(headers) == "text/event-stream"


def _media_type(headers: Any) -> str:
    return str(headers.get("content-type", "")).split(";")[0].strip().lower()


def is_json(headers: Any) -> bool:
    """The answer says its body is JSON (``application/json``, or a ``+json`` type such as problem+json)."""
    media = _media_type(headers)
    return media == "application/json" or media.endswith("+json")


# An answer whose body is not read for JSON: not typed JSON, none is expected (204, 205), or it is not an answer
# (3xx, 4xx, 5xx: the SDK raises its own error, whatever the body).
NOT_READ = object()


class UnreadableAnswer(ClassifiedError):
    """A provider answered 2xx with a JSON content type and a body that is not JSON (cut off, an HTML page).

    Transient (``server_error``): the request was good and the provider failed to deliver its answer, as a
    cut-off body or a proxy's error page usually is, once; asking again usually gets a whole answer. The
    answer is never kept, so a retry or a re-execution asks the provider again instead of replaying what no
    client can read. Its ledger row's outcome is ``unreadable_result`` (as a provider job's unreadable result
    line), with a note quoting the body's start."""

    ledger_outcome = UNREADABLE_RESULT

    def __init__(self, endpoint: str, status: int, media: str, body: bytes, why: str, *,
                 what: str | None = None, category: str = "server_error") -> None:
        """``what`` the answer is (default: so many bytes that are not JSON), ``why`` in detail; ``body``: the
        part of it the ledger's note quotes; ``category``: a transient one the provider's own error in the answer
        names (:func:`answer_error_category`: a rate limit is backed off from, not an outage)."""
        start = body[:80].decode("utf-8", errors="replace")
        what = what or f"{len(body)} bytes that are not JSON"
        self.ledger_note = redact(f"HTTP {status} {media}, {what} ({why}): {start!r}; not kept, asked again")[:500]
        # A 2xx answer was probably billed: a spend cap counts it at its estimate, as a timeout (see AttemptHold);
        # a rate limit's refusal inside it was not (a trial: 39 such refusals were charged 4,010 tokens to a cap
        # whose ledger said 1,670 were spent), so its room goes back as a 429's does
        self.charged = category != "rate_limit"
        super().__init__(category=category, retryable=True, status_code=status, endpoint=endpoint,
                         message=f"an unreadable answer: HTTP {status} {media}, {what} ({why}); not kept: a retry "
                                 "asks the provider again")


def answer_error_category(values: list[Any]) -> str:
    """The category of the provider's own error inside a 2xx answer that is not its answer: the first ``error``
    object's type (a stream's error event, a failed response's ``error``), read as the classifier reads an SDK's
    error body. A transient type decides (a rate limit: ``rate_limit``; an overload: ``server_error``); any other
    answer is ``server_error``, as any unreadable answer: asked again."""
    for value in values:
        for holder in (value, value.get("response")) if isinstance(value, dict) else ():
            kind = error_object_type(holder.get("error")) if isinstance(holder, dict) else None
            if kind is not None:
                verdict = PROVIDER_ERROR_TYPES[kind]
                return verdict.category if verdict.retryable else "server_error"
    return "server_error"


def undecodable_answer(endpoint: str, status: int, headers: Any, body: bytes, exc: BaseException) -> UnreadableAnswer:
    """The :class:`UnreadableAnswer` of a body whose content encoding does not decode (a corrupt gzip answer or
    stream): no client could read it either. ``body``: what decoded before the error."""
    encoding = str(headers.get("content-encoding", ""))
    return UnreadableAnswer(endpoint, status, f"{_media_type(headers) or 'no content type'} ({encoding})", body,
                            f"not {encoding}: {exc}"[:120], what=f"{len(body)} bytes decoded")


def read_json_answer(endpoint: str, status: int, headers: Any, body: bytes) -> Any:
    """The JSON value of a 2xx answer whose content type says JSON; NOT_READ for any other answer. Raises
    :class:`UnreadableAnswer` when the body does not parse: the SDK could not read it either, and keeping it
    would replay it to every re-execution."""
    if not 200 <= status < 300 or status in (204, 205) or not is_json(headers):
        return NOT_READ
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise UnreadableAnswer(endpoint, status, _media_type(headers), body, str(exc)[:120]) from None


def check_event_stream(endpoint: str, status: int, body: bytes, api_path: str = "") -> None:
    """Raises :class:`UnreadableAnswer` for a streamed answer (its decoded body) that is not the provider's whole
    answer, as a proxy or a provider that failed mid-answer may end it:

    - an event holds JSON that does not parse: it was cut off as the stream ended;
    - the stream's API is known and its last event never came (see :mod:`event_streams`): it ended between two
      events, or on an error event.

    An SDK drops such a last event, or stops at the connection's end: either way the answer it shows is not the
    provider's whole answer, and keeping it would replay that to every re-execution. Events that are not JSON
    (``[DONE]``, any plain text) are left alone."""
    payloads = event_payloads(body)
    events = []
    for number, payload in enumerate(payloads, 1):
        if payload[:1] not in ("{", "[") or payload == DONE:  # OpenAI's last event
            continue
        try:
            events.append(json.loads(payload))
        except (ValueError, RecursionError) as exc:
            raise UnreadableAnswer(endpoint, status, "text/event-stream", payload.encode("utf-8", "replace"),
                                   f"event {number} of the stream: {exc}"[:120]) from None
    cut_off = unfinished_stream(payloads, events, api_path)
    if cut_off is not None:
        tail = payloads[-1] if payloads else ""
        ended_on_error = any(isinstance(e, dict) and (isinstance(e.get("error"), dict) or e.get("type") == "error")
                             for e in events)
        raise UnreadableAnswer(endpoint, status, "text/event-stream", tail.encode("utf-8", "replace"), cut_off,
                               what="a stream the provider ended on its error" if ended_on_error
                               else "a stream cut off before its end", category=answer_error_category(events))


def check_answer(endpoint: str, api_path: str, status: int, headers: Any, body: bytes) -> Any:
    """:func:`read_json_answer`, and for a POST to ``api_path`` (an API call; "": another request, not judged)
    raises :class:`UnreadableAnswer` for a 2xx answer that is not its API's answer: an HTML page (a proxy's, a
    captive portal's: no provider API answers a call with HTML), or JSON that is not in its API's shape (see
    :mod:`answer_shapes`: the provider's error with a 200, a chat completion without choices)."""
    parsed = read_json_answer(endpoint, status, headers, body)
    if not api_path or not 200 <= status < 300:
        return parsed
    if _media_type(headers) == "text/html":
        raise UnreadableAnswer(endpoint, status, "text/html", body, "an HTML page, not an API's answer",
                               what=f"{len(body)} bytes of HTML")
    if parsed is not NOT_READ:
        problem = shape_problem(api_path, parsed)
        if problem is not None:
            raise UnreadableAnswer(endpoint, status, _media_type(headers), body, problem,
                                   what="JSON that is not the API's answer", category=answer_error_category([parsed]))
    return parsed


def stream_reached_end(body: bytes, api_path: str) -> bool:
    """A stream (its decoded bytes so far) is its API's whole answer: whatever stops its reader now (a tail read
    cancelled, a connection reset before the chunked body's end), the provider finished and billed it. False for
    a stream no protocol knows: nothing says it ended."""
    if stream_protocol(api_path, event_values(body)) is None:
        return False
    try:
        check_event_stream("", 200, body, api_path)
    except UnreadableAnswer:
        return False
    return True


def check_kept_answer(endpoint: str, api_path: str, kept: Any) -> None:
    """Raises :class:`UnreadableAnswer` for a journaled answer that no client can read (kept before this was
    checked): it is asked again instead of replayed."""
    if isinstance(kept, dict) and kept.get("http") == 1 and isinstance(kept.get("status"), int):
        headers = {str(name).lower(): value for name, value in kept.get("headers") or []}
        if is_event_stream(headers):
            check_event_stream(endpoint, kept["status"], decode_body(kept["body"]), api_path)
            return
        check_answer(endpoint, api_path, kept["status"], headers, decode_body(kept["body"]))


def encode_body(body: bytes) -> dict[str, str]:
    try:
        return {"text": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(body).decode("ascii")}


def decode_body(kept: dict[str, str]) -> bytes:
    if "text" in kept:
        return kept["text"].encode("utf-8")
    return base64.b64decode(kept["base64"])


def kept_answer(status: int, headers: Any, body: bytes) -> dict[str, Any]:
    """The answer as the journal keeps it (a JSON value): status, the headers that matter, the body."""
    return {"http": 1, "status": status, "headers": [[name, headers[name]] for name in KEPT_HEADERS if name in headers],
            "body": encode_body(body)}


def answer_usage(body: bytes, streamed: bool, parsed: Any = NOT_READ) -> tuple[dict[str, Any] | None, str | None]:
    """The usage figures of an answer (the last value of each, over a stream's events) and the model that
    answered; (None, None) when the answer says nothing. ``parsed``: the body, already read as JSON."""
    if streamed:
        payloads = event_values(body)
    elif parsed is not NOT_READ:
        payloads = [parsed]
    else:
        try:
            payloads = [json.loads(body)]
        except ValueError:
            return None, None
    usage: dict[str, Any] = {}
    model = None
    for payload in payloads:
        if not isinstance(payload, dict):
            continue
        for holder in (payload, payload.get("message"), payload.get("response")):
            if not isinstance(holder, dict):
                continue
            if isinstance(holder.get("usage"), dict):
                usage.update({k: v for k, v in holder["usage"].items() if v is not None})
            if isinstance(holder.get("model"), str):
                model = holder["model"]
    return (usage or None), model


def answered_call(endpoint: str, model: str | None, body: bytes, *, streamed: bool, latency: float,
                  prices: Prices, provider: str | None, parsed: Any = NOT_READ,
                  estimate: tuple[int, int] | None = None) -> ProviderCall:
    """The ledger's record of an answer: its usage in tokens, its cost when priced; an answer without usage
    is recorded as 0 tokens with a note, and no cost. ``parsed``: the body, already read as JSON; ``estimate``:
    the request's (tokens in, most tokens out) when it asked for its usage: a stream cut before that usage came
    counts at it, priced, with a note (the answer is whole, and asking again to learn its usage would pay twice;
    counted as 0 it would slip past the spend caps)."""
    usage, answered_by = answer_usage(body, streamed, parsed)
    note = None
    if usage is None and estimate is not None:
        (tokens_in, tokens_out), note = estimate, CUT_BEFORE_USAGE
    elif usage is None:
        tokens_in, tokens_out, note = 0, 0, NO_USAGE
    elif "prompt_tokens" in usage or "completion_tokens" in usage:
        tokens_in, tokens_out, note = read_usage(usage)
    else:
        tokens_in, tokens_out, note = read_usage(usage, names=("input_tokens", "output_tokens"))
        for name in ANTHROPIC_CACHE_FIELDS:
            tokens_in += token_count(usage.get(name)) or 0
    shown_model = answered_by[:200] if answered_by else None
    # a note says the figures are not what the provider counted: no cost, unless they are the estimate (the most
    # the call can cost, so a spend cap in money holds)
    cost = None if note not in (None, CUT_BEFORE_USAGE) else prices.cost(model or answered_by, tokens_in, tokens_out)
    return ProviderCall(endpoint=endpoint, model=model or shown_model, tokens_in=tokens_in, tokens_out=tokens_out,
                        latency_seconds=latency, outcome="ok", cost=cost, operation="chat", provider=provider,
                        response_model=shown_model, note=note)
