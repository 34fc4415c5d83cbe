"""Structured facts before words: the precedence of codes, statuses, groups and messages."""

from __future__ import annotations

import botocore.exceptions
import pytest

from recovery_ext import classify, register_rule
from recovery_ext._classify import rules


def aws(code: str, status: int, message: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, "InvokeModel")


def test_a_provider_code_decides_before_its_status_and_its_words():
    assert classify(aws("ThrottlingException", 400, "invalid request: parameter rejected")).retryable is True
    assert classify(aws("ValidationException", 400, "Rate exceeded, service unavailable")).retryable is False
    assert classify(aws("KMSThrottlingException", 400, "")).retryable is True


def test_the_outermost_fact_decides_the_chain():
    try:
        try:
            raise aws("ThrottlingException", 400, "slow down")
        except botocore.exceptions.ClientError as throttled:
            raise aws("AccessDeniedException", 403, "denied") from throttled
    except botocore.exceptions.ClientError as outer:
        assert classify(outer).retryable is False


def test_a_group_is_transient_only_when_every_member_is():
    assert classify(ExceptionGroup("all", [TimeoutError("a"), ConnectionResetError("b")])).retryable is True
    mixed = classify(ExceptionGroup("mixed", [TimeoutError("a"), aws("ValidationException", 400, "bad")]))
    assert mixed.retryable is False and mixed.reason.startswith("exception group: AWS ValidationException")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [TimeoutError("a")]), ConnectionResetError("b")])
    assert classify(nested).retryable is True


def test_an_explicit_flag_on_a_member_counts_and_a_rule_reaches_members():
    class Flagged(Exception):
        retryable = True

    assert classify(ExceptionGroup("g", [Flagged("x"), TimeoutError("t")])).retryable is True

    class Ours(Exception):
        pass

    assert classify(ExceptionGroup("g", [Ours("x"), TimeoutError("t")])).retryable is False
    rule = register_rule(Ours, retryable=True)
    try:
        assert classify(ExceptionGroup("g", [Ours("x"), TimeoutError("t")])).retryable is True
    finally:
        rules.unregister_rule(rule)


@pytest.mark.parametrize("status", [100, 200, 204])
def test_a_success_status_does_not_decide(status):
    class StreamError(Exception):
        status_code = status

    assert classify(StreamError("model is overloaded")).retryable is True
    assert classify(StreamError("invalid request")).retryable is False
