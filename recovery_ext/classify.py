"""The one retry classifier every op, sensor, watchdog and CLI uses (seed 002).

Decision order:

1. **An explicit flag wins**: a bool ``retryable`` attribute or an ``is_retryable()``
   method on the exception or anything in its ``__cause__``/``__context__`` chain; the
   outermost one counts.
2. **Structure**: HTTP status attributes, SQLSTATE codes, SQLAlchemy wrappers, sqlite
   busy errors, ``OSError.errno``, timeout types, CUDA/out-of-memory types. Libraries are
   looked up in ``sys.modules`` only: an exception cannot come from a library nobody imported.
3. **Message patterns** last, with word boundaries and context: a number is an HTTP
   status only where the text says so ("HTTP 503", "status 503", "503 Service Unavailable").
"""

from __future__ import annotations

import errno
import re
import socket
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import RecoveryError
from .redaction import redact

CATEGORIES = (
    "connection", "timeout", "rate_limit", "server_error", "gpu", "resource_exhausted", "database_transient",
    "client_error", "auth", "not_found", "validation", "unknown",
)

RETRYABLE_HTTP = frozenset({408, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 525, 526, 527, 529, 530, 598, 599})


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
    if 400 <= status < 500:
        return Classification(False, "client_error", status, why)
    return Classification(False, "server_error", status, why)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then what caused it, outermost first; cycles and depth are bounded."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver error here
        if isinstance(orig, BaseException) and id(orig) not in seen and orig is not current.__cause__:
            seen.add(id(orig))
            yield orig
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def _explicit_flag(exc: BaseException) -> bool | None:
    flag = getattr(exc, "retryable", None)
    if isinstance(flag, bool):
        return flag
    method = getattr(exc, "is_retryable", None)
    if callable(method):
        try:
            value = method()
        except Exception:
            return None
        if isinstance(value, bool):
            return value
    return None


def _status_of(exc: BaseException) -> int | None:
    for holder in (exc, getattr(exc, "response", None)):
        if holder is None:
            continue
        for attr in ("status_code", "status"):
            try:
                value = getattr(holder, attr, None)
            except Exception:
                continue
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    code = getattr(exc, "code", None)  # urllib.error.HTTPError
    if type(exc).__name__ == "HTTPError" and isinstance(code, int) and 100 <= code <= 599:
        return code
    return None


def _loaded_types(module: str, *names: str) -> tuple[type, ...]:
    mod = sys.modules.get(module)
    if mod is None:
        return ()
    found = []
    for name in names:
        obj = mod
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, type):
            found.append(obj)
    return tuple(found)


def _library_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    timeouts = (
        _loaded_types("httpx", "TimeoutException")
        + _loaded_types("httpcore", "TimeoutException")
        + _loaded_types("requests", "exceptions.Timeout")
        + _loaded_types("urllib3.exceptions", "TimeoutError")
        + _loaded_types("aiohttp", "ServerTimeoutError")
        + _loaded_types("openai", "APITimeoutError")
    )
    connections = (
        _loaded_types("httpx", "TransportError")
        + _loaded_types("httpcore", "NetworkError", "RemoteProtocolError")
        + _loaded_types("requests", "exceptions.ConnectionError")
        + _loaded_types("urllib3.exceptions", "ProtocolError", "NewConnectionError", "MaxRetryError")
        + _loaded_types("aiohttp", "ClientConnectionError")
        + _loaded_types("openai", "APIConnectionError")
    )
    return timeouts, connections


_RETRYABLE_ERRNOS = {
    errno.ECONNREFUSED: "connection", errno.ECONNRESET: "connection", errno.ECONNABORTED: "connection",
    errno.EPIPE: "connection", errno.ETIMEDOUT: "timeout", errno.EHOSTUNREACH: "connection",
    errno.ENETUNREACH: "connection", errno.ENETDOWN: "connection",
}
_EAI_AGAIN = getattr(socket, "EAI_AGAIN", -3)


def _sqlstate(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return code if isinstance(code, str) and len(code) == 5 else None


def _structural(exc: BaseException) -> Classification | None:
    name = type(exc).__name__
    status = _status_of(exc)
    if status is not None:
        return http_classification(status)

    state = _sqlstate(exc)
    if state is not None:
        if state[:2] == "08":
            return Classification(True, "database_transient", None, f"SQLSTATE {state}: connection exception")
        if state in ("40001", "40P01"):
            what = "serialization failure" if state == "40001" else "deadlock detected"
            return Classification(True, "database_transient", None, f"SQLSTATE {state}: {what}")
        if state[:2] in ("53", "57"):
            return Classification(True, "database_transient", None, f"SQLSTATE {state}: resources/operator intervention")
        if state[:2] == "23":
            return Classification(False, "validation", None, f"SQLSTATE {state}: integrity constraint violation")
        if state in ("42P01", "42703", "42883", "42704", "3F000", "3D000"):
            return Classification(False, "not_found", None, f"SQLSTATE {state}: undefined object")
        if state[:2] in ("42", "22"):
            return Classification(False, "client_error", None, f"SQLSTATE {state}: syntax or data error")
        if state[:2] == "28":
            return Classification(False, "auth", None, f"SQLSTATE {state}: invalid authorization")
        return Classification(False, "unknown", None, f"SQLSTATE {state}")

    if getattr(exc, "connection_invalidated", False) is True:
        return Classification(True, "database_transient", None, "database connection invalidated")

    module = type(exc).__module__ or ""
    if module.startswith(("psycopg", "psycopg2")) and name == "OperationalError":
        return Classification(True, "database_transient", None, "database unreachable")

    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        text = str(exc).lower()
        if code in (5, 6, 261, 262, 517) or "database is locked" in text or "database is busy" in text:
            return Classification(True, "database_transient", None, "sqlite database is locked")
        return Classification(False, "unknown", None, "sqlite operational error")

    if isinstance(exc, socket.gaierror):
        if exc.errno == _EAI_AGAIN:
            return Classification(True, "connection", None, "temporary failure in name resolution")
        return Classification(False, "not_found", None, "host name does not resolve")

    timeouts, connections = _library_types()
    if isinstance(exc, TimeoutError) or (timeouts and isinstance(exc, timeouts)):
        return Classification(True, "timeout", None, f"{name}: timed out")
    if connections and isinstance(exc, connections):
        return Classification(True, "connection", None, f"{name}: connection failed")

    if isinstance(exc, OSError) and exc.errno in _RETRYABLE_ERRNOS:
        return Classification(True, _RETRYABLE_ERRNOS[exc.errno], None, f"{errno.errorcode.get(exc.errno, exc.errno)}")
    if isinstance(exc, ConnectionError):
        return Classification(True, "connection", None, f"{name}")

    if "OutOfMemory" in name or name in ("CudaError", "CUDAError"):
        return Classification(True, "gpu", None, f"{name}: GPU out of memory")
    if isinstance(exc, MemoryError):
        return Classification(True, "resource_exhausted", None, "out of memory")
    return None


_STATUS_IN_TEXT = re.compile(
    r"(?i)(?:\bHTTP(?:/\d(?:\.\d)?)?\s*(?:status\s*)?(?:code\s*)?[:=]?\s*|\bstatus(?:[ _]code)?\s*[:=]?\s*"
    r"|\berror\s+code\s*[:=]?\s*|\bresponse\s+code\s*[:=]?\s*)(?P<code>[1-5]\d\d)\b"
)
_STATUS_WITH_PHRASE = re.compile(
    r"(?i)\b(?P<code>[1-5]\d\d)\s+(?:service unavailable|bad gateway|gateway time-?out|internal server error"
    r"|too many requests|request time-?out|unauthorized|forbidden|not found|bad request)\b"
)
_PATTERNS: tuple[tuple[re.Pattern[str], Classification], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cls)
    for pattern, cls in (
        (r"\brate[ -]?limit(?:ed|s|ing)?\b|\btoo many requests\b|\bquota exceeded\b",
         Classification(True, "rate_limit", None, "rate limited")),
        (r"\bservice (?:is )?(?:busy|unavailable)\b|\bserver (?:is )?(?:busy|overloaded)\b|\boverloaded_error\b",
         Classification(True, "server_error", None, "service unavailable")),
        (r"\bcuda (?:error|out of memory)\b|\bgpu (?:error|out of memory)\b|\bcudnn_status_\w+|\bcublas_status_\w+",
         Classification(True, "gpu", None, "GPU error")),
        (r"\bout of memory\b|\bcannot allocate memory\b",
         Classification(True, "resource_exhausted", None, "out of memory")),
        (r"\bdeadlock detected\b|\bcould not serialize access\b|\bdatabase is locked\b|\btoo many connections\b",
         Classification(True, "database_transient", None, "transient database error")),
        (r"\bconnection (?:refused|reset|aborted|closed unexpectedly|timed out)\b|\bbroken pipe\b"
         r"|\bnetwork is unreachable\b|\bno route to host\b|\bno such host\b|\btemporary failure in name resolution\b",
         Classification(True, "connection", None, "connection failed")),
        (r"\b(?:operation|request|read|connect|connection|i/o|socket) timed? ?out\b|\btimed out\b"
         r"|\bdeadline exceeded\b|\btimeout (?:error|exceeded|expired|occurred)\b",
         Classification(True, "timeout", None, "timed out")),
        (r"\binvalid api key\b|\bincorrect api key\b|\bunauthori[sz]ed\b|\bauthentication failed\b",
         Classification(False, "auth", None, "not authorized")),
    )
)


def _from_message(exc: BaseException) -> Classification | None:
    try:
        text = str(exc)
    except Exception:
        return None
    if not text:
        return None
    for regex in (_STATUS_IN_TEXT, _STATUS_WITH_PHRASE):
        match = regex.search(text)
        if match:
            return http_classification(int(match.group("code")), f"HTTP {match.group('code')} (from message)")
    for regex, result in _PATTERNS:
        if regex.search(text):
            return result
    return None


def _classify(exc: BaseException) -> Classification:
    chain = list(_chain(exc))
    flag: bool | None = None
    for link in chain:
        flag = _explicit_flag(link)
        if flag is not None:
            break
    found: Classification | None = None
    for link in chain:
        category = getattr(link, "category", None)
        if isinstance(category, str) and category in CATEGORIES:
            status = getattr(link, "status_code", None)
            found = Classification(
                bool(getattr(link, "retryable", False)), category, status if isinstance(status, int) else None,
                f"{type(link).__name__}",
            )
            break
        found = _structural(link)
        if found is not None:
            break
    if found is None:
        for link in chain:
            found = _from_message(link)
            if found is not None:
                break
    if found is None:
        found = Classification(False, "unknown", None, f"unrecognised {type(exc).__name__}")
    if flag is not None and flag != found.retryable:
        return Classification(flag, found.category, found.status_code, f"explicit retryable={flag}; {found.reason}")
    return found


def classify(exc: BaseException) -> Classification:
    """Classify an exception; never raises, whatever the exception does."""
    try:
        return _classify(exc)
    except Exception as failure:  # a hostile __str__/__getattr__ must not break the caller
        return Classification(False, "unknown", None, f"classifier could not inspect the error ({type(failure).__name__})")


def is_retryable(exc: BaseException) -> bool:
    return classify(exc).retryable


class ClassifiedError(RecoveryError):
    """An operation failed; the error carries its category, status, model and endpoint."""

    def __init__(
        self,
        cause: BaseException | str | None = None,
        *,
        category: str | None = None,
        status_code: int | None = None,
        retryable: bool | None = None,
        model: str | None = None,
        endpoint: str | None = None,
        message: str | None = None,
    ) -> None:
        found = classify(cause) if isinstance(cause, BaseException) else None
        self.category = category or (found.category if found else "unknown")
        self.status_code = status_code if status_code is not None else (found.status_code if found else None)
        self.retryable = retryable if retryable is not None else (found.retryable if found else False)
        self.model = model
        self.endpoint = endpoint
        detail = message if message is not None else (str(cause) if cause is not None else self.category)
        self.detail = redact(detail)
        super().__init__(self._render())
        if isinstance(cause, BaseException):
            self.__cause__ = cause

    def _render(self) -> str:
        parts = [self.category]
        if self.status_code is not None:
            parts.append(f"HTTP {self.status_code}")
        if self.model:
            parts.append(f"model={self.model}")
        if self.endpoint:
            parts.append(f"endpoint={self.endpoint}")
        # Redact the header on its own so a masked value cannot swallow the separator.
        return f"{redact(' '.join(parts))}: {self.detail}"

    def __str__(self) -> str:
        return self._render()

    def metadata(self) -> dict[str, object]:
        return {"category": self.category, "status_code": self.status_code, "model": self.model,
                "endpoint": redact(self.endpoint) if self.endpoint else None, "retryable": self.retryable}


def with_context(exc: BaseException, *, model: str | None = None, endpoint: str | None = None) -> ClassifiedError:
    """Wrap any exception as a :class:`ClassifiedError`, keeping what the classifier found."""
    if isinstance(exc, ClassifiedError):
        if model and not exc.model:
            exc.model = model
        if endpoint and not exc.endpoint:
            exc.endpoint = endpoint
        return exc
    return ClassifiedError(exc, model=model, endpoint=endpoint)
