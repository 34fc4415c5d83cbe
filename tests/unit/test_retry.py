"""The retry policy against a real HTTP server on 127.0.0.1 and a real PostgreSQL; no real sleeping."""

from __future__ import annotations

import random
import threading

import httpx
import openai
import psycopg
import pytest
import tenacity
from hypothesis import given
from hypothesis import strategies as st

from recovery_ext._classify.classifier import classify
from recovery_ext._errors import ConfigurationError, StopRequested
from recovery_ext._classify.retry import (
    EscalatedError,
    retry_if_retryable,
    retrying,
    stop_after_same_error,
    wait_jittered_exponential,
)


def call(server):
    response = httpx.post(server.url_for("/v1/chat/completions"), json={"q": 1}, timeout=5)
    response.raise_for_status()
    return response.json()


def serve_sequence(httpserver, statuses):
    for status in statuses:
        body = {"ok": True} if status == 200 else {"error": {"message": f"status {status}"}}
        httpserver.expect_ordered_request("/v1/chat/completions").respond_with_json(body, status=status)


def test_503_503_200_is_retried_and_the_waits_stay_in_the_jitter_bounds(httpserver):
    serve_sequence(httpserver, [503, 503, 200])
    slept: list[float] = []
    policy = retrying(sleep=slept.append, initial_delay=1.0, jitter=0.1)
    assert policy.call(call, httpserver) == {"ok": True}
    assert len(httpserver.log) == 3 and len(slept) == 2
    for attempt, delay in enumerate(slept, start=1):
        low, high = policy.wait.bounds(attempt)
        assert low <= delay <= high
    assert 0.9 <= slept[0] <= 1.1 and 1.8 <= slept[1] <= 2.2


def test_six_503s_escalate_after_five(httpserver):
    serve_sequence(httpserver, [503] * 6)
    slept: list[float] = []
    with pytest.raises(EscalatedError) as info:
        retrying(sleep=slept.append, max_attempts=20).call(call, httpserver)
    assert "repeated server_error error (5 times)" in str(info.value)
    assert info.value.retryable is False and classify(info.value).retryable is False
    assert len(httpserver.log) == 5 and len(slept) == 4


def test_without_escalation_the_streak_stops_the_retries_and_the_error_stays_transient(httpserver):
    serve_sequence(httpserver, [503] * 6)
    slept: list[float] = []
    with pytest.raises(httpx.HTTPStatusError) as info:  # the last error itself, not an EscalatedError
        retrying(sleep=slept.append, max_attempts=20, escalate=False).call(call, httpserver)
    assert info.value.response.status_code == 503 and classify(info.value).retryable is True
    assert len(httpserver.log) == 5 and len(slept) == 4


def test_a_different_category_resets_the_escalation_count(httpserver):
    serve_sequence(httpserver, [503, 503, 503, 429, 503, 503, 503, 200])
    assert retrying(sleep=lambda s: None, max_attempts=20).call(call, httpserver) == {"ok": True}
    assert len(httpserver.log) == 8


def test_401_is_not_retried(httpserver):
    serve_sequence(httpserver, [401])
    slept: list[float] = []
    with pytest.raises(httpx.HTTPStatusError):
        retrying(sleep=slept.append).call(call, httpserver)
    assert len(httpserver.log) == 1 and slept == []


def test_decorator_and_context_forms(httpserver):
    serve_sequence(httpserver, [502, 200, 500, 200])
    slept: list[float] = []

    @retrying(sleep=slept.append)
    def decorated():
        return call(httpserver)

    assert decorated() == {"ok": True}
    for attempt in retrying(sleep=slept.append):
        with attempt:
            result = call(httpserver)
    assert result == {"ok": True} and len(slept) == 2


def test_openai_sdk_exceptions_from_a_local_server(httpserver):
    serve_sequence(httpserver, [503, 429, 401])
    client = openai.OpenAI(base_url=httpserver.url_for("/v1"), api_key="sk-test-1234567890", max_retries=0)
    found = []
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        found.append(classify(info.value))
    assert [(f.category, f.status_code, f.retryable) for f in found] == [
        ("server_error", 503, True), ("rate_limit", 429, True), ("auth", 401, False)]
    dead = openai.OpenAI(base_url="http://127.0.0.1:1/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as info:
        dead.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert classify(info.value).category == "connection" and classify(info.value).retryable


def test_shutdown_event_stops_the_waiting_at_once():
    shutdown = threading.Event()
    attempts = []

    def failing():
        attempts.append(1)
        shutdown.set()
        raise TimeoutError()

    with pytest.raises(StopRequested):
        retrying(shutdown=shutdown, initial_delay=3600).call(failing)
    assert len(attempts) == 1


def test_building_blocks_compose_with_tenacity():
    calls = []

    def flaky():
        calls.append(1)
        raise ConnectionResetError()

    r = tenacity.Retrying(
        retry=retry_if_retryable() & tenacity.retry_if_exception_type(OSError),
        stop=stop_after_same_error(3) | tenacity.stop_after_attempt(10),
        wait=wait_jittered_exponential(0.5, jitter=0) + tenacity.wait_fixed(0),
        sleep=lambda s: None, reraise=True,
    )
    with pytest.raises(ConnectionResetError):
        r(flaky)
    assert len(calls) == 3


def test_invalid_policy_settings_are_rejected():
    for bad in (dict(jitter=1.5), dict(jitter=-0.1), dict(max_attempts=0), dict(same_error_limit=0),
                dict(initial_delay=-1)):
        with pytest.raises(ConfigurationError):
            retrying(**bad)


@given(st.floats(0, 1), st.integers(1, 40), st.floats(0.01, 100), st.integers(0, 2**32))
def test_property_jitter_stays_in_bounds(jitter, attempt, initial, seed):
    wait = wait_jittered_exponential(initial, max_delay=300, jitter=jitter, rng=random.Random(seed))
    low, high = wait.bounds(attempt)
    delay = wait.delay(attempt)
    assert max(0.0, low) - 1e-9 <= delay <= high + 1e-9
    if jitter == 0:
        assert delay == wait.base_delay(attempt)


# -- real PostgreSQL errors -----------------------------------------------------------------------

def _conninfo(url):
    return url.replace("postgresql+psycopg://", "postgresql://")


def test_real_postgres_deadlock_and_serialization_failure_are_retryable_unique_violation_is_not(pg_url):
    info = _conninfo(pg_url)
    with psycopg.connect(info, autocommit=True) as setup:
        setup.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        setup.execute("INSERT INTO t VALUES (1, 0), (2, 0)")

    # deadlock: each transaction locks one row, then wants the other's
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def locker(first, second):
        try:
            with psycopg.connect(info) as conn:
                conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (first,))
                barrier.wait()
                conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (second,))
                conn.commit()
        except psycopg.Error as exc:
            errors.append(exc)

    threads = [threading.Thread(target=locker, args=(1, 2)), threading.Thread(target=locker, args=(2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 1 and errors[0].sqlstate == "40P01"
    assert classify(errors[0]).retryable is True

    # serialization failure under REPEATABLE READ
    with psycopg.connect(info) as a, psycopg.connect(info, autocommit=True) as b:
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        a.execute("SELECT v FROM t WHERE id = 1").fetchone()
        b.execute("UPDATE t SET v = v + 10 WHERE id = 1")
        with pytest.raises(psycopg.Error) as serial:
            a.execute("UPDATE t SET v = v + 1 WHERE id = 1")
    assert serial.value.sqlstate == "40001" and classify(serial.value).retryable is True

    with psycopg.connect(info, autocommit=True) as conn, pytest.raises(psycopg.errors.UniqueViolation) as unique:
        conn.execute("INSERT INTO t VALUES (1, 0)")
    found = classify(unique.value)
    assert found.retryable is False and found.category == "validation"


def _escalated() -> EscalatedError:
    try:
        raise httpx.ConnectError("connection refused")
    except httpx.ConnectError as transient:
        try:
            raise EscalatedError(transient, category="connection", retryable=False, message="repeated") from transient
        except EscalatedError as escalated:
            return escalated


class _BodysOwnError(Exception):
    pass


def _wrapped(escalated: EscalatedError) -> Exception:
    try:
        raise _BodysOwnError("the body gave up") from escalated
    except _BodysOwnError as exc:
        return exc


def test_an_escalation_is_undone_alone_in_a_task_group_and_under_the_body_s_own_error():
    from recovery_ext._classify.retry import without_escalation

    alone = _escalated()
    assert isinstance(without_escalation(alone), httpx.ConnectError)
    group = ExceptionGroup("tasks", [_escalated(), _escalated()])
    undone = without_escalation(group)
    assert isinstance(undone, ExceptionGroup) and undone.message == "tasks"
    assert all(isinstance(member, httpx.ConnectError) for member in undone.exceptions)
    assert classify(group).retryable is False and classify(undone).retryable is True
    assert isinstance(without_escalation(_wrapped(_escalated())), httpx.ConnectError)
    permanent = ValueError("a bug")
    assert without_escalation(permanent) is permanent
    assert without_escalation(ExceptionGroup("tasks", [permanent])).exceptions == (permanent,)
