"""The error types LLM providers put in their bodies (Anthropic, OpenAI and the APIs that copy them).

A type decides before the HTTP status of the response it came in: a stream that reports
``overloaded_error`` inside HTTP 200 is an overload, not a success.
"""

from __future__ import annotations

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


def _error_type(exc: BaseException) -> str | None:
    for value in (getattr(exc, "code", None), getattr(exc, "type", None)):
        if isinstance(value, str) and value in PROVIDER_ERROR_TYPES:
            return value
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        kind = error.get("type") if isinstance(error, dict) else None
        if isinstance(kind, str) and kind in PROVIDER_ERROR_TYPES:
            return kind
    return None


def judge_provider_error(types: tuple[type, ...]) -> Judge:
    """The judge for one SDK's ``APIError`` types: their body's error type, with the status it came with."""

    def facts(exc: BaseException) -> Classification | None:
        if not types or not isinstance(exc, types):
            return None
        kind = _error_type(exc)
        if kind is None:
            return None
        verdict = PROVIDER_ERROR_TYPES[kind]
        status = getattr(exc, "status_code", None)
        return Classification(verdict.retryable, verdict.category, status if isinstance(status, int) else None,
                              f"{verdict.reason} ({kind})")

    return facts
