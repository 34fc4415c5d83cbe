"""Redaction: every message the project logs, stores or returns passes through :func:`redact`."""

from __future__ import annotations

import re

MASK = "***"

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host
    (re.compile(r"(?P<pre>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/:@]*:)[^\s@/]+(?P<post>@)"), rf"\g<pre>{MASK}\g<post>"),
    # Authorization: Bearer <token> / Basic <token>
    (re.compile(r"(?i)\b(?P<pre>bearer|basic)\s+[A-Za-z0-9._~+/\-]+=*"), rf"\g<pre> {MASK}"),
    # key=value in query strings, config dumps and JSON-ish text
    (
        re.compile(
            r"""(?ix)(?P<pre>\b(?:api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|token|secret|password|passwd|pwd|key)
            ["']?\s*[=:]\s*["']?)(?P<val>[^\s&"',;}]+)"""
        ),
        rf"\g<pre>{MASK}",
    ),
    # well-known key shapes standing alone: OpenAI/Anthropic style sk-..., GitHub, Slack, AWS
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bxox[abpr]-[A-Za-z0-9\-]{10,}"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
)


def redact(text: object) -> str:
    """Mask API keys, bearer tokens, passwords in URLs and ``key=``/``token=`` parameters."""
    value = str(text)
    for pattern, replacement in _PATTERNS:
        value = pattern.sub(replacement, value)
    return value


def redact_secret(text: object, secrets: tuple[str, ...] = ()) -> str:
    """Like :func:`redact`, and also masks the given literal secrets wherever they appear."""
    value = str(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            value = value.replace(secret, MASK)
    return redact(value)
