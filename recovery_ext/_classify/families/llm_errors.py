"""The error types LLM providers put in their bodies (Anthropic, OpenAI and the APIs that copy them).

A type decides before the HTTP status of the response it came in: a stream that reports
``overloaded_error`` inside HTTP 200 is an overload, not a success.
"""

from __future__ import annotations

import json
from typing import Any

from recovery_ext._classify.families import Judge
from recovery_ext._classify.verdict import Classification, permanent, transient

PROVIDER_ERROR_TYPES = {
    "overloaded_error": transient("server_error", "provider overloaded"),
    "api_error": transient("server_error", "provider server error"),
    "server_error": transient("server_error", "provider server error"),
    "internal_server_error": transient("server_error", "provider server error"),
    "service_unavailable": transient("server_error", "provider unavailable"),
    "timeout_error": transient("timeout", "provider timed out"),
    "rate_limit_error": transient("rate_limit", "provider rate limit"),
    "rate_limit_exceeded": transient("rate_limit", "provider rate limit"),
    "tokens": transient("rate_limit", "provider token rate limit"),
    "requests": transient("rate_limit", "provider request rate limit"),
    "insufficient_quota": permanent("auth", "provider quota or billing exhausted"),
    "billing_error": permanent("auth", "provider quota or billing exhausted"),
    "invalid_request_error": permanent("validation", "invalid request"),
    "request_too_large": permanent("validation", "request too large"),
    "context_length_exceeded": permanent("validation", "context length exceeded"),
    "authentication_error": permanent("auth", "not authenticated"),
    "invalid_api_key": permanent("auth", "invalid API key"),
    "permission_error": permanent("auth", "not permitted"),
    "not_found_error": permanent("not_found", "not found"),
    "model_not_found": permanent("not_found", "model not found"),
}


# The most of an HTTP error's body read to find its error type: an error body is small; a larger one is not read.
BODY_LIMIT = 64 * 1024


def error_object_type(error: Any) -> str | None:
    """The known provider error type an error object (``{"code": ..., "type": ...}``) names: its ``code``, else its
    ``type``; None when it names none this table knows."""
    if not isinstance(error, dict):
        return None
    for key in ("code", "type"):
        kind = error.get(key)
        if isinstance(kind, str) and kind in PROVIDER_ERROR_TYPES:
            return kind
    return None


def _error_type(exc: BaseException) -> str | None:
    for value in (getattr(exc, "code", None), getattr(exc, "type", None)):
        if isinstance(value, str) and value in PROVIDER_ERROR_TYPES:
            return value
    body = getattr(exc, "body", None)
    return error_object_type(body.get("error", body)) if isinstance(body, dict) else None


def _verdict(kind: str, status: Any) -> Classification:
    verdict = PROVIDER_ERROR_TYPES[kind]
    return Classification(verdict.retryable, verdict.category, status if isinstance(status, int) else None,
                          f"{verdict.reason} ({kind})")


def judge_provider_error(types: tuple[type, ...]) -> Judge:
    """The judge for one SDK's ``APIError`` types: their body's error type, with the status it came with."""

    def facts(exc: BaseException) -> Classification | None:
        if not types or not isinstance(exc, types):
            return None
        kind = _error_type(exc)
        return None if kind is None else _verdict(kind, getattr(exc, "status_code", None))

    return facts


def judge_response_body(types: tuple[type, ...]) -> Judge:
    """The judge for an HTTP client's status error (httpx's ``HTTPStatusError``) whose response body was read: the
    provider's error type in it decides before the status, as in an SDK's error (a 429 that says
    ``insufficient_quota`` is a billing wall, not a rate limit). A body not read, too large or not JSON: no say."""

    def facts(exc: BaseException) -> Classification | None:
        if not types or not isinstance(exc, types):
            return None
        response = getattr(exc, "response", None)
        try:
            content = response.content if response is not None else None  # raises when the body was not read
        except Exception:  # noqa: BLE001 - httpx's ResponseNotRead: nothing to judge by
            return None
        if not isinstance(content, bytes) or not content or len(content) > BODY_LIMIT:
            return None
        try:
            body = json.loads(content)
        except (ValueError, RecursionError):
            return None
        kind = error_object_type(body.get("error", body)) if isinstance(body, dict) else None
        return None if kind is None else _verdict(kind, getattr(response, "status_code", None))

    return facts
