"""The shared classifier: one test per rule, traps for naive matchers, and properties."""

from __future__ import annotations

import asyncio
import errno
import socket
import sqlite3

import httpx
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_ext._classify.classifier import ClassifiedError, classify, is_retryable, with_context
from recovery_ext._classify.redaction import redact


class Flagged(Exception):
    def __init__(self, message, retryable):
        super().__init__(message)
        self.retryable = retryable


class MethodFlag(Exception):
    def is_retryable(self):
        return True


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as final:
        return final


# -- explicit flag ------------------------------------------------------------------------------

def test_explicit_flag_beats_structure_and_message():
    assert classify(Flagged("HTTP 503 Service Unavailable", retryable=False)).retryable is False
    assert classify(Flagged("invalid api key", retryable=True)).retryable is True
    assert classify(MethodFlag("whatever")).retryable is True


def test_outermost_explicit_flag_counts():
    exc = chained(Flagged("outer", retryable=False), Flagged("inner", retryable=True))
    assert classify(exc).retryable is False
    exc = chained(RuntimeError("wrapper"), Flagged("inner", retryable=True))
    assert classify(exc).retryable is True


# -- HTTP status --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "status,retryable,category",
    [
        (408, True, "timeout"),
        (429, True, "rate_limit"),
        (500, True, "server_error"),
        (502, True, "server_error"),
        (503, True, "server_error"),
        (504, True, "server_error"),
        (529, True, "server_error"),
        (520, True, "server_error"),  # Cloudflare: the provider's origin answered nothing usable
        (522, True, "server_error"),
        (524, True, "server_error"),  # Cloudflare: the origin took too long
        (599, True, "server_error"),
        (505, False, "server_error"),
        (511, False, "auth"),
        (400, False, "validation"),
        (401, False, "auth"),
        (403, False, "auth"),
        (404, False, "not_found"),
        (418, False, "client_error"),
        (501, False, "server_error"),
    ],
)
def test_http_status_from_httpx(status, retryable, category):
    request = httpx.Request("POST", "https://api.example/v1/chat/completions")
    response = httpx.Response(status, request=request)
    exc = httpx.HTTPStatusError("boom", request=request, response=response)
    found = classify(exc)
    assert (found.retryable, found.category, found.status_code) == (retryable, category, status)


@pytest.mark.parametrize(("status", "body", "verdict"), [
    (429, {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}, (False, "auth", 429)),
    (429, {"error": {"type": "requests", "code": "rate_limit_exceeded"}}, (True, "rate_limit", 429)),
    (429, {"type": "error", "error": {"type": "rate_limit_error"}}, (True, "rate_limit", 429)),
    (429, {"error": {"code": 429, "message": "slow down"}}, (True, "rate_limit", 429)),  # not a named type
    (503, {"error": {"type": "overloaded_error"}}, (True, "server_error", 503)),
    (400, {"error": {"code": "context_length_exceeded"}}, (False, "validation", 400)),
    (429, ["not", "an", "object"], (True, "rate_limit", 429)),
])
def test_a_status_error_whose_body_was_read_is_judged_by_the_providers_error_type_first(status, body, verdict):
    """LLMResource's transport reads every answer before raising httpx's HTTPStatusError: a review found a 429
    saying `insufficient_quota` (a billing wall) read as a rate limit by its status alone, while the SDK's own error
    for the same answer is permanent. The body's error type now decides first, as for the SDK's error."""
    import json

    request = httpx.Request("POST", "https://api.example/v1/chat/completions")
    response = httpx.Response(status, request=request, content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})
    found = classify(httpx.HTTPStatusError("refused", request=request, response=response))
    assert (found.retryable, found.category, found.status_code) == verdict


def test_a_status_error_whose_body_was_not_read_or_is_too_large_is_judged_by_its_status():
    request = httpx.Request("POST", "https://api.example/v1/chat/completions")
    unread = httpx.Response(429, request=request, stream=httpx.ByteStream(b'{"error": {"code": "insufficient_quota"}}'))
    large = httpx.Response(429, request=request, content=b'{"error": {"code": "insufficient_quota"}, "pad": "'
                           + b"x" * 70_000 + b'"}')
    for response in (unread, large):
        found = classify(httpx.HTTPStatusError("refused", request=request, response=response))
        assert (found.retryable, found.category, found.status_code) == (True, "rate_limit", 429)


def test_http_status_from_requests_and_plain_attributes():
    response = requests.Response()
    response.status_code = 503
    assert classify(requests.HTTPError("x", response=response)).status_code == 503

    class AioLike(Exception):
        status = 429

    assert classify(AioLike()).category == "rate_limit"


def test_transport_errors_of_http_libraries():
    assert classify(httpx.ConnectError("refused")).category == "connection"
    assert classify(httpx.ReadTimeout("slow")).category == "timeout"
    assert classify(requests.ConnectionError("down")).category == "connection"
    assert classify(requests.Timeout("slow")).category == "timeout"


# -- databases ----------------------------------------------------------------------------------

class FakePgError(Exception):
    def __init__(self, sqlstate):
        super().__init__(f"error {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize("code,retryable", [
    ("08006", True), ("08001", True), ("40001", True), ("40P01", True), ("53300", True), ("57P01", True),
    ("23505", False), ("42601", False), ("42P01", False), ("22012", False),
])
def test_sqlstate_rules(code, retryable):
    assert classify(FakePgError(code)).retryable is retryable


def test_sqlalchemy_wrapper_and_invalidated_connection():
    from sqlalchemy.exc import OperationalError

    wrapped = OperationalError("SELECT 1", {}, FakePgError("40P01"))
    assert classify(wrapped).category == "database_transient"
    invalidated = OperationalError("SELECT 1", {}, Exception("gone"), connection_invalidated=True)
    assert classify(invalidated).retryable is True


def test_sqlite_locked_is_transient_other_sqlite_errors_are_not():
    assert classify(sqlite3.OperationalError("database is locked")).retryable is True
    assert classify(sqlite3.OperationalError("no such table: x")).retryable is False


# -- OS, timeouts, GPU --------------------------------------------------------------------------

@pytest.mark.parametrize("code", [errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE,
                                  errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH])
def test_os_errnos(code):
    assert classify(OSError(code, "x")).retryable is True


def test_permanent_os_errors_and_dns():
    assert classify(FileNotFoundError(errno.ENOENT, "nope")).retryable is False
    assert classify(socket.gaierror(socket.EAI_AGAIN, "try again")).retryable is True
    assert classify(socket.gaierror(socket.EAI_NONAME, "unknown host")).retryable is True  # DNS: transient


def test_timeouts():
    # the aliases socket and asyncio raise, named as a caller meets them
    for exc in (TimeoutError(), socket.timeout(), asyncio.TimeoutError()):  # noqa: UP041
        assert classify(exc).category == "timeout"


def test_gpu_and_memory():
    class OutOfMemoryError(RuntimeError):
        pass

    assert classify(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")).category == "gpu"
    assert classify(RuntimeError("CUDA error: device-side assert")).category == "gpu"
    assert classify(RuntimeError("remote worker: out of memory")).category == "resource_exhausted"
    assert classify(MemoryError()).retryable is False  # a local MemoryError is not a remote service's


# -- message patterns, and traps for naive matchers -----------------------------------------------

@pytest.mark.parametrize("message,category", [
    ("upstream returned HTTP 503", "server_error"), ("status 429 from provider", "rate_limit"),
    ("503 Service Unavailable", "server_error"), ("Rate limit reached for gpt-4o", "rate_limit"),
    ("the service is busy, try later", "server_error"), ("connection reset by peer", "connection"),
    ("read timed out", "timeout"), ("deadlock detected", "database_transient"),
    ("status_code=502", "server_error"),
])
def test_message_patterns(message, category):
    found = classify(RuntimeError(message))
    assert found.category == category and found.retryable is True


@pytest.mark.parametrize("message", [
    "processed 500 rows", "timeout must be positive", "order 4290 shipped", "user 503 not allowed",
    "port 5000 is in use", "connectionless protocol", "ratelimiter module missing argument",
    "wrote 502 bytes", "invalid literal for int() with base 10: '503'",
])
def test_traps_for_naive_matchers_are_not_retryable(message):
    found = classify(ValueError(message))
    assert found.retryable is False and found.status_code is None, found


# -- error context and redaction ----------------------------------------------------------------

def test_classified_error_renders_context_and_redacts():
    cause = RuntimeError("HTTP 503 upstream busy; api_key=sk-live-abcdefghijkl")
    err = with_context(cause, model="gpt-4o", endpoint="https://user:hunter2@api.example/v1?key=SECRET")
    text = str(err)
    assert text.startswith("server_error HTTP 503 model=gpt-4o endpoint=https://user:***@api.example/v1?key=***: ")
    assert "hunter2" not in text and "SECRET" not in text and "sk-live" not in text
    assert err.retryable is True and err.__cause__ is cause
    assert err.metadata()["status_code"] == 503
    assert classify(err).category == "server_error"


def test_redaction_of_tokens():
    assert redact("Authorization: Bearer eyJhbGciOi.x-y") == "Authorization: Bearer ***"
    assert redact("https://x/y?token=abc&q=1") == "https://x/y?token=***&q=1"
    assert redact("postgresql://u:p4ss@db/x") == "postgresql://u:***@db/x"
    assert redact("nothing secret here") == "nothing secret here"


def test_is_retryable_shortcut():
    assert is_retryable(ConnectionRefusedError()) and not is_retryable(KeyError("x"))


# -- properties ---------------------------------------------------------------------------------

@given(st.text(), st.booleans())
def test_property_explicit_flag_always_wins(message, flag):
    assert classify(Flagged(message, retryable=flag)).retryable is flag


class Hostile(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")

    def __getattr__(self, name):
        raise RuntimeError(f"no {name}")


exception_types = st.sampled_from([Exception, ValueError, RuntimeError, OSError, KeyError, TimeoutError, Hostile,
                                   ConnectionError, MemoryError, sqlite3.OperationalError])


@settings(max_examples=300)
@given(exception_types, st.lists(st.one_of(st.text(), st.integers(), st.none()), max_size=3),
       st.one_of(st.none(), st.integers(), st.text(), st.booleans()))
def test_property_classify_never_raises(kind, args, attr):
    try:
        exc = kind(*args)
    except Exception:
        exc = kind()
    try:
        exc.status_code = attr
        exc.retryable = attr
    except Exception:
        pass
    exc.__cause__ = exc  # a cycle must not hang it
    found = classify(exc)
    assert isinstance(found.retryable, bool) and isinstance(found.category, str)


def test_classified_error_from_plain_message():
    err = ClassifiedError("disk full", category="resource_exhausted", retryable=True)
    assert str(err) == "resource_exhausted: disk full"


@pytest.mark.parametrize("option", ["sslmode=bogus", "target_session_attrs=bogus", "keepalives=x", "gssencmode=bogus",
                                    "options=-c%20no_such_setting%3D1", "options=-c%20statement_timeout%3Dabc"])
def test_malformed_connection_options_are_permanent_not_an_outage(option, pg_admin):
    """libpq refuses the first four before contacting a server; the server refuses the last two at startup."""
    import psycopg

    from recovery_ext._errors import StoreUnavailable
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(f"{pg_admin}?{option}", retry_budget=30)
    try:
        with pytest.raises(Exception) as raised:
            store.pending_migrations()
        assert not isinstance(raised.value, StoreUnavailable), raised.value
        driver_error = raised.value.__cause__.orig
        assert isinstance(driver_error, psycopg.OperationalError)
        found = classify(driver_error)
        assert (found.retryable, found.category) == (False, "configuration")
    finally:
        store.close()


def test_a_bad_port_number_is_permanent_and_a_refused_port_is_transient():
    import psycopg

    errors = {}
    for port in (99999, 1):
        with pytest.raises(psycopg.OperationalError) as raised:
            psycopg.connect(f"host=127.0.0.1 port={port} user=postgres connect_timeout=3")
        errors[port] = classify(raised.value)
    assert (errors[99999].retryable, errors[99999].category) == (False, "configuration")
    assert errors[1].retryable


@pytest.mark.parametrize(("message", "retryable"), [
    ("smtp: error code 550 (mailbox unavailable)", False),  # an SMTP reply, not an HTTP status
    ("upload refused: status 554", False),
    ("upstream answered HTTP 503", True),
    ("upstream answered HTTP 524", False),  # in words, only the statuses every HTTP server means alike
])
def test_a_status_read_in_words_is_transient_only_among_the_common_http_ones(message, retryable):
    assert classify(RuntimeError(message)).retryable is retryable


def test_an_sdk_error_wrapping_a_classified_error_says_the_reason_it_was_raised_from():
    """A hostile trial: the Anthropic SDK wraps whatever its transport raises (here the outage budget given up on)
    in its own APIConnectionError("Connection error."), so the pipeline's error read "server_error HTTP 200:
    Connection error." and lost the reason. The words of the classified error it was raised from are kept."""
    import anthropic

    reason = ClassifiedError(category="server_error", status_code=200, retryable=False,
                             message="gave up: stayed unavailable for 32 s, longer than the outage budget of 15 s")
    try:
        try:
            raise reason
        except ClassifiedError as exc:
            raise anthropic.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1/v1/messages")) from exc
    except anthropic.APIConnectionError as wrapped:
        err = with_context(wrapped)
    assert "Connection error." in str(err) and "longer than the outage budget of 15 s" in str(err), str(err)
    # an error that says it already is not repeated, and one raised without a cause is as it was
    try:
        raise RuntimeError(f"the body says: {reason.detail}") from reason
    except RuntimeError as says_it:
        assert str(ClassifiedError(says_it)).count("outage budget") == 1
    assert ClassifiedError(RuntimeError("plain")).detail == "plain"


def test_a_classified_error_without_words_of_its_own_never_breaks_the_error_wrapping_it():
    """A review: a subclass that skips ClassifiedError's __init__ (no ``detail``), or sets it to None, made the
    wrapper's own construction raise inside an error handler."""

    class Wordless(ClassifiedError):
        def __init__(self) -> None:  # noqa: D107 - deliberately skips super().__init__
            Exception.__init__(self, "wordless")

    class NoneSaid(ClassifiedError):
        def __init__(self) -> None:
            super().__init__(message="set below")
            self.detail = None

    for inner in (Wordless(), NoneSaid()):
        try:
            raise RuntimeError("outer words") from inner
        except RuntimeError as outer:
            assert with_context(outer).detail == "outer words"


def test_a_mapped_items_error_keeps_the_classified_reason_its_wrapper_hides():
    """A review: ``ctx.map``'s failed items named their error by the wrapper's words alone ("Connection error.")."""
    from recovery_ext._dagster.parallel import _classified

    reason = ClassifiedError(category="server_error", retryable=False, message="gave up: the outage budget is spent")
    try:
        raise ConnectionError("Connection error.") from reason
    except ConnectionError as wrapped:
        assert str(_classified(wrapped)).endswith("Connection error.: gave up: the outage budget is spent")
