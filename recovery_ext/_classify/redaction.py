"""Redaction: every message the project logs, stores or returns passes through :func:`redact`;
every URL-like value (a database URL, a provider endpoint) through :func:`redact_url` before it is
stored, shown, logged or used as a key; run config through :func:`redact_config` before it is stored."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"

# Names whose value is a secret: as a query parameter, a ``key=value`` in text, a config key.
# ``sslpassword``, ``client_secret``, ``x-api-key``, ``auth_token`` ...: a prefix does not hide it.
_SECRET_NAME = (
    r"[\w.\-]*?(?:password|passwd|passphrase|secret|token|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key"
    r"|credentials?|signature)|pwd|key|sig"
)
# Names that carry a secret only as a URL parameter (``?code=`` is an Azure Functions key or an OAuth
# code, ``?auth=`` a Firebase token, ``;jsessionid=`` a session, ``?user_key=``/``?app_key=`` an API
# gateway's key, ``?sessionKey=``, ``?jwt=``): in prose "code: 503" or "item_key=doc-1" is no secret.
_URL_SECRET_NAME = (r"code|auth|authorization|jsessionid|phpsessid|sessionid|session[_\-]?id|client[_\-]?assertion"
                    r"|[\w.\-]*key|jwt|pass")
_SECRET_NAME_RE = re.compile(rf"(?i)^(?:{_SECRET_NAME}|{_URL_SECRET_NAME})$")
# a name that ends in one of these (``db_password``, ``openai_api_key``) holds a secret in config
_SECRET_KEY_RE = re.compile(r"(?i)(?:password|passwd|passphrase|secret|token|api[_\-]?key|apikey|access[_\-]?key"
                            r"|private[_\-]?key|credentials?)$")

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host
    (re.compile(r"(?P<pre>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/:@]*:)[^\s@/]+(?P<post>@)"), rf"\g<pre>{MASK}\g<post>"),
    # Authorization: Bearer <token> / Basic <token>
    (re.compile(r"(?i)\b(?P<pre>bearer|basic)\s+[A-Za-z0-9._~+/\-]+=*"), rf"\g<pre> {MASK}"),
    # name=value in query strings, config dumps and JSON-ish text
    (
        re.compile(rf"""(?ix)(?P<pre>\b(?:{_SECRET_NAME})["']?\s*[=:]\s*["']?)(?P<val>[^\s&"',;}}]+)"""),
        rf"\g<pre>{MASK}",
    ),
    # a Telegram bot token in a path: /bot<id>:<secret>/
    (re.compile(r"(?P<pre>/bot\d+:)[A-Za-z0-9_\-]+"), rf"\g<pre>{MASK}"),
    # well-known key shapes standing alone: OpenAI/Anthropic style sk-..., GitHub, Slack, AWS
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bxox[abpr]-[A-Za-z0-9\-]{10,}"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
)


def redact(text: object) -> str:
    """Mask API keys, bearer tokens, passwords in URLs and ``password=``/``token=``-like parameters.

    A NUL byte becomes U+FFFD: what is redacted is stored (a pause reason, a breaker's or a node's error
    quoting a provider's message), and PostgreSQL's text and JSON refuse NUL where SQLite keeps it."""
    value = str(text).replace("\x00", "\ufffd")
    for pattern, replacement in _PATTERNS:
        value = pattern.sub(replacement, value)
    return _URL_PARAMETER.sub(_mask_url_parameter, value)


# A URL parameter in text, in a query (?, &), a path parameter (;) or a fragment (#): masked when its name,
# percent-decoded as the server reads it, is a secret's (a URL-only one included).
_URL_PARAMETER = re.compile(r"(?P<pre>[?&;#](?P<name>[^\s=&#;?\"'<>]{1,100})=)(?P<val>[^\s&#;?\"'<>]+)")


def _mask_url_parameter(match: re.Match[str]) -> str:
    return f"{match['pre']}{MASK}" if _SECRET_NAME_RE.match(unquote(match["name"])) else match[0]


def redact_secret(text: object, secrets: tuple[str, ...] = ()) -> str:
    """Like :func:`redact`, and also masks the given literal secrets wherever they appear."""
    value = str(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            value = value.replace(secret, MASK)
    return redact(value)


def redact_url(url: object) -> str:
    """A URL as it may be stored, shown, logged or used as a key: the password of its userinfo and the
    values of password-like query parameters (``password``, ``sslpassword``, ``api_key``, ``token``,
    ``client_secret`` ...) masked. The same URL always gives the same text.

    Takes a string or a SQLAlchemy ``URL``; text that is not a URL is redacted as text.
    """
    if isinstance(url, str):
        return _redact_url_text(url)
    render = getattr(url, "render_as_string", None)
    return _redact_url_text(render(hide_password=False) if callable(render) else str(url))


# A process talks to a handful of endpoints, and every provider call the ledger records redacts its
# endpoint: parsing and seven pattern passes cost about half of building the call's record. Pure, so
# cached; bounded, so a stream of distinct URLs cannot grow it.
@functools.lru_cache(maxsize=256)
def _redact_url_text(text: str) -> str:
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. an unbalanced IPv6 bracket: not a URL, still redacted as text
        return redact(text)
    if parts.scheme and not parts.netloc and "@" in text and not text[len(parts.scheme) + 1:].startswith("/"):
        # a URL without its "//" ("postgres:password@host/db?sslmode=require"): what stands between its scheme and
        # its last "@" may be a password, whatever it holds ("?" and "#" too)
        return redact(f"{parts.scheme}:{MASK}@{text.rpartition('@')[2]}")
    if not parts.scheme or not (parts.netloc or parts.query):
        return redact(text)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        if ":" in userinfo:
            userinfo = f"{userinfo.split(':', 1)[0]}:{MASK}"
        netloc = f"{userinfo}@{host}"
    query = "&".join(_redact_parameter(p) for p in parts.query.split("&")) if parts.query else ""
    return redact(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


def _redact_parameter(parameter: str) -> str:
    name, sep, _value = parameter.partition("=")
    # the server reads ``api%5Fkey`` as ``api_key``
    return f"{name}={MASK}" if sep and _SECRET_NAME_RE.match(unquote(name)) else parameter


def redact_config(config: Any) -> Any:
    """Run config as it may be stored: values under secret-like keys (``api_key``, ``password``,
    ``client_secret`` ...) masked, and every string redacted (a URL's password, a ``token=``)."""
    if isinstance(config, Mapping):
        return {key: (MASK if isinstance(key, str) and _SECRET_KEY_RE.search(key) and value is not None
                      and not isinstance(value, (Mapping, list, tuple, bool)) else redact_config(value))
                for key, value in config.items()}
    if isinstance(config, (list, tuple)):
        return [redact_config(v) for v in config]
    if isinstance(config, str):
        return redact(config)
    return config
