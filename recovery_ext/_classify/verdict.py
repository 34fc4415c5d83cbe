"""What a classification says, and how an HTTP status reads: shared by the classifier and its families."""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = (
    "connection", "timeout", "rate_limit", "server_error", "gpu", "resource_exhausted", "database_transient",
    "circuit_open", "client_error", "auth", "not_found", "validation", "tls", "protocol", "configuration",
    "unknown",
)

# A server error is the server's trouble and passes, as both provider SDKs read it (they retry every 5xx): a
# provider behind Cloudflare answers 520-524 while its origin is down or slow, 529 when overloaded. Only the
# statuses that say the request itself cannot work are permanent: 501 Not Implemented, 505 HTTP Version Not
# Supported, 506 Variant Also Negotiates, 508 Loop Detected, 510 Not Extended (and 511, a proxy's login: auth).
PERMANENT_SERVER_ERRORS = frozenset({501, 505, 506, 508, 510, 511})
RETRYABLE_HTTP = frozenset({408, 429} | {status for status in range(500, 600) if status not in PERMANENT_SERVER_ERRORS})


@dataclass(frozen=True)
class Classification:
    retryable: bool
    category: str
    status_code: int | None = None
    reason: str = ""


# What a number in an error's words reads as transient: these only. A message's "error code 550" or "status 554"
# is as likely an SMTP or FTP reply as an HTTP status; a status an exception carries is read by RETRYABLE_HTTP.
RETRYABLE_IN_WORDS = frozenset({408, 429, 500, 502, 503, 504, 529})


def http_classification(status: int, reason: str | None = None, *, from_words: bool = False) -> Classification:
    """``from_words``: the status was read in a message, not carried by the exception (see RETRYABLE_IN_WORDS)."""
    why = reason or f"HTTP {status}"
    if status in (RETRYABLE_IN_WORDS if from_words else RETRYABLE_HTTP):
        category = {408: "timeout", 429: "rate_limit"}.get(status, "server_error")
        return Classification(True, category, status, why)
    if status in (401, 403, 407, 511):
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
