"""The facts any exception carries, read whatever its library, and this machine's resources against a remote's."""

from __future__ import annotations

import errno

import pytest

from recovery_ext import classify


def make(name: str, base: type[BaseException] = Exception, message: str = "", **attrs) -> BaseException:
    return type(name, (base,), attrs)(message)


@pytest.mark.parametrize("spelling", ["retryable", "retriable", "is_retryable", "is_retriable", "temporary",
                                      "transient"])
def test_a_flag_under_any_common_spelling_as_attribute_or_method(spelling):
    assert classify(make("SdkError", **{spelling: True}, message="invalid request")).retryable is True
    assert classify(make("SdkError", **{spelling: lambda self: False}, base=TimeoutError)).retryable is False


def test_error_labels_read_through_the_method_or_the_attribute():
    class Labelled(Exception):
        def has_error_label(self, label: str) -> bool:
            return label == "TransientTransactionError"

    assert classify(Labelled("write conflict")).retryable is True
    assert classify(make("Driver", message="bad value", _error_labels={"RetryableWriteError"})).retryable is True
    assert classify(make("Driver", message="bad value", _error_labels={"NoWritesPerformed"})).retryable is False


def test_timeout_true_counts_and_a_timeout_number_does_not():
    assert classify(make("OperationFailure", message="operation exceeded", timeout=True)).retryable is True
    assert classify(make("ConfigError", message="bad option", timeout=30)).retryable is False


@pytest.mark.parametrize(("code", "retryable"), [("ECONNRESET", True), ("ETIMEDOUT", True), ("UNAVAILABLE", True),
                                                 ("rate_limit_error", True), ("ENOENT", False),
                                                 ("PERMISSION_DENIED", False), ("invalid_request_error", False)])
def test_a_named_code(code, retryable):
    assert classify(make("SdkError", code=code)).retryable is retryable


def test_errno_wherever_it_sits():
    assert classify(make("ClientError", errno=errno.ECONNRESET)).retryable is True
    assert classify(make("ClientError", errno=errno.ENOENT, message="lost connection")).retryable is False
    assert classify(OSError(503, "Not Ready or Lagging")).status_code == 503  # an errno no OS uses: a status
    assert classify(OSError(404, "Not Found")).retryable is False


def test_bulk_item_errors_are_transient_only_when_every_item_is():
    rejected = {"index": {"status": 429, "error": {"type": "es_rejected_execution_exception"}}}
    mapping = {"index": {"status": 400, "error": {"type": "mapper_parsing_exception"}}}
    assert classify(make("BulkError", message="2 failed", errors=[rejected, rejected])).retryable is True
    assert classify(make("BulkError", message="2 failed", errors=[rejected, mapping])).retryable is False


def test_the_real_cause_held_in_args_exception_or_errors():
    assert classify(RuntimeError(ConnectionRefusedError(111, "refused"))).retryable is True
    assert classify(make("ConnectError", exception=ConnectionResetError("reset"))).retryable is True
    refused = make("NoValidConnections", base=OSError, errors={("127.0.0.1", 22): ConnectionRefusedError(111, "x")})
    assert classify(refused).retryable is True


def test_the_class_name_is_the_weakest_signal():
    assert classify(make("GatewayTimeout")).retryable is True
    assert classify(make("AutoReconnect")).retryable is True
    assert classify(make("GatewayTimeout", message="invalid api key")).retryable is False  # the words decide first
    assert classify(make("GatewayTimeout", retryable=False)).retryable is False


@pytest.mark.parametrize("number", [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_this_machines_resources_are_permanent_whatever_wraps_them(number):
    local = OSError(number, "exhausted")

    class ConnectTimeout(TimeoutError):  # urllib3's NewConnectionError extends its ConnectTimeoutError
        retryable = True

    try:
        try:
            raise local
        except OSError as cause:
            raise ConnectTimeout("connect failed") from cause
    except ConnectTimeout as wrapper:
        found = classify(wrapper)
    assert (found.retryable, found.category) == (False, "resource_exhausted"), found
    assert classify(RuntimeError("worker failed", MemoryError())).retryable is False


def test_a_remote_servers_overload_stays_transient():
    assert classify(make("DbError", message="out of memory", sqlstate="53200")).retryable is True
    assert classify(RuntimeError("upstream: 503 Service Unavailable")).retryable is True
    assert classify(RuntimeError("server error: cannot allocate memory")).retryable is True
