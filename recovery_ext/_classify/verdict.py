"""What a classification says, and how an HTTP status reads: shared by the classifier and its families."""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = (
    "connection", "timeout", "rate_limit", "server_error", "gpu", "resource_exhausted", "database_transient",
    "circuit_open", "client_error", "auth", "not_found", "validation", "tls", "protocol", "configuration",
    "unknown",
)

RETRYABLE_HTTP = frozenset({408, 429, 500, 502, 503, 504, 529})


@dataclass(frozen=True)
class Classification:
    retryable: bool
    category: str
    status_code: int | None = None
    reason: str = ""


def http_classification(status: int, reason: str | None = None) -> Classification:
    why = reason or f"HTTP {status}"
    if status in RETRYABLE_HTTP:
        category = {408: "timeout", 429: "rate_limit"}.get(status, "server_error")
        return Classification(True, category, status, why)
    if status in (401, 403, 407):
        return Classification(False, "auth", status, why)
    if status in (404, 410):
        return Classification(False, "not_found", status, why)
    if status in (400, 409, 412, 413, 415, 422):
        return Classification(False, "validation", status, why)
    if 300 <= status < 500:
        return Classification(False, "client_error", status, why)
    return Classification(False, "server_error", status, why)


def transient(category: str, reason: str, status: int | None = None) -> Classification:
    return Classification(True, category, status, reason)


def permanent(category: str, reason: str, status: int | None = None) -> Classification:
    return Classification(False, category, status, reason)
