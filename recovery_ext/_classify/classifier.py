"""The one retry classifier every op, sensor, watchdog and CLI uses.

How it decides, in this order (docs/how-to/classifier.md), for the exceptions of the chain
(``__cause__``/``__context__`` and what one holds in ``args``, ``.exception``, ``.errors``,
``.exceptions``), outermost first:

1. **Users' rules** (:func:`recovery_ext.register_rule`, the ``recovery_ext.classifier_rules`` entry points).
2. **This machine's resources**: EMFILE/ENFILE, ENOMEM or ``MemoryError``, ENOSPC/EDQUOT, EROFS anywhere
   in the chain is permanent for the node, whatever wraps it; a remote server's overload is not this.
3. **An explicit flag** (``retryable``, ``retriable``, ``is_retryable``, ``temporary``, ``transient``;
   attribute or method) wins over everything below.
4. **Family codes** (botocore, the LLM SDKs, gRPC, MySQL errno, SMTP/FTP/AMQP replies, MongoDB ...) and
   exception groups (transient only when every member is), then 5. **generic facts** any exception may
   carry (error labels, ``timeout=True``, a named ``code``, an ``errno``, bulk per-item statuses), then
   6. **an HTTP status** of 300 or more: the outermost exception that carries one of these decides.
7. **Otherwise the chain is transient if any exception in it is transient.** Each exception is judged
   on its own, in tiers, and a higher tier of the whole chain beats a lower one:

   * *structure*: SQLSTATE codes, sqlite error types, the library families' types, ``ssl``/DNS/``errno``,
     timeout types, logic errors (``ValueError``, ``KeyError`` ...);
   * *message*: word-bounded phrases; words inside identifiers (``lock_timeout``,
     ``x-ratelimit-remaining``) are not messages, and a number is a status only where the text says so;
   * *wrapper*: generic transport wrappers (``httpx.TransportError``, ``requests.ConnectionError``,
     a driver's ``OperationalError``) that mean "it did not get through" only when nothing they wrap says why;
   * *name*: the weakest signal, a class whose own name says ``Timeout`` or ``Reconnect``.

   What a library's errors mean lives in its family (``recovery_ext/_classify/families``), loaded only
   once the library is in ``sys.modules``: an exception cannot come from a library nobody imported.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import errno
import math
import re
import socket
import sqlite3
import ssl
import time
from collections.abc import Iterator

from recovery_ext._classify import families
from recovery_ext._classify.families.grpc import GRPC_CODES
from recovery_ext._classify.families.llm_errors import PROVIDER_ERROR_TYPES
from recovery_ext._classify.redaction import redact
from recovery_ext._classify.rules import user_verdict
from recovery_ext._classify.verdict import CATEGORIES, RETRYABLE_HTTP, Classification, http_classification
from recovery_ext._errors import RecoveryError

__all__ = ["CATEGORIES", "RETRYABLE_HTTP", "Classification", "ClassifiedError", "classify", "http_classification",
           "is_retryable", "retry_after_header", "retry_after_of", "with_context"]

def _chain(exc: BaseException, seen: set[int] | None = None) -> Iterator[BaseException]:
    """The exception, then what caused it, outermost first; cycles and depth are bounded."""
    seen = set() if seen is None else seen
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        yield current
        for attr in ("orig", "reason"):  # SQLAlchemy's DBAPIError.orig, urllib's URLError.reason
            inner = getattr(current, attr, None)
            if isinstance(inner, BaseException) and id(inner) not in seen and inner is not current.__cause__:
                seen.add(id(inner))
                yield inner
        # a retry helper's last error, kept outside __cause__
        for unwrap in families.active().unwrappers(type(current)):
            inner = unwrap(current)
            if inner is not None and id(inner) not in seen:
                seen.add(id(inner))
                yield inner
        for inner in _nested(current):  # the real cause held in args, .errors or .exceptions
            if id(inner) not in seen:
                yield from _chain(inner, seen)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def _nested(exc: BaseException) -> list[BaseException]:
    """Exceptions one holds outside ``__cause__``: in its ``args``, ``.exception``, or an ``.errors``/``.exceptions``
    list or mapping (paramiko's per-address errors, pika's connection attempts). A group's members are
    judged as a group (:func:`_group`), not as causes."""
    found = [arg for arg in exc.args if isinstance(arg, BaseException)] if exc.args else []
    single = getattr(exc, "exception", None)
    if isinstance(single, BaseException):
        found.append(single)
    for attr in ("errors", "exceptions"):
        held = getattr(exc, attr, None)
        if held is None or callable(held) or isinstance(exc, BaseExceptionGroup):
            continue
        values = held.values() if isinstance(held, dict) else held if isinstance(held, (list, tuple)) else ()
        found.extend(value for value in values if isinstance(value, BaseException))
    return found


_FLAGS = ("retryable", "retriable", "is_retryable", "is_retriable", "temporary", "transient")


def _explicit_flag(exc: BaseException) -> bool | None:
    """A bool the exception says about itself, as an attribute or a method, under its common spellings."""
    for name in _FLAGS:
        try:
            flag = getattr(exc, name, None)
            if callable(flag) and not isinstance(flag, type):
                flag = flag()
        except Exception:
            continue
        if isinstance(flag, bool):
            return flag
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


_RETRYABLE_ERRNOS = {
    errno.ECONNREFUSED: "connection", errno.ECONNRESET: "connection", errno.ECONNABORTED: "connection",
    errno.EPIPE: "connection", errno.ETIMEDOUT: "timeout", errno.EHOSTUNREACH: "connection",
    errno.ENETUNREACH: "connection", errno.ENETDOWN: "connection", errno.ENETRESET: "connection",
}
_PERMANENT_ERRNOS = {
    errno.ENOENT: "not_found", errno.ENOTDIR: "not_found", errno.EISDIR: "validation", errno.EACCES: "auth",
    errno.EPERM: "auth", errno.EINVAL: "validation", errno.EADDRNOTAVAIL: "configuration",
}
_LOGIC_ERRORS = (ValueError, TypeError, LookupError, AttributeError, AssertionError, NotImplementedError,
                 ArithmeticError, UnicodeError, NameError, ImportError)

# SQLSTATE classes and codes (PostgreSQL appendix A).
_TRANSIENT_SQLSTATES = {
    "40001": "serialization failure", "40P01": "deadlock detected", "55P03": "lock timeout (lock not available)",
    "25P03": "idle-in-transaction session timeout", "57014": "statement timeout (query canceled)",
    "57P01": "admin shutdown", "57P02": "crash shutdown", "57P03": "cannot connect now",
    "57P05": "idle session timeout", "53300": "too many connections", "53200": "out of memory",
    "53100": "disk full", "58000": "system error", "58030": "I/O error",
}
_PERMANENT_SQLSTATE_CLASSES = {
    "23": ("validation", "integrity constraint violation"), "42": ("client_error", "syntax error or undefined object"),
    "22": ("validation", "data exception"), "28": ("auth", "invalid authorization"),
    "3D": ("not_found", "database does not exist"), "3F": ("not_found", "schema does not exist"),
}


def _sqlstate(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return code if isinstance(code, str) and len(code) == 5 else None


def _from_sqlstate(state: str) -> Classification:
    if state in _TRANSIENT_SQLSTATES:
        return Classification(True, "database_transient", None, f"SQLSTATE {state}: {_TRANSIENT_SQLSTATES[state]}")
    if state[:2] == "08":
        return Classification(True, "database_transient", None, f"SQLSTATE {state}: connection exception")
    category, what = _PERMANENT_SQLSTATE_CLASSES.get(state[:2], ("unknown", "database error"))
    return Classification(False, category, None, f"SQLSTATE {state}: {what}")


# This machine's own resources: a retry on the same node meets the same wall, whatever wrapper says otherwise.
_LOCAL_EXHAUSTION = {
    errno.EMFILE: "too many open files in this process", errno.ENFILE: "too many open files on this machine",
    errno.ENOMEM: "this machine is out of memory", errno.ENOSPC: "no space left on this machine's disk",
    errno.EDQUOT: "disk quota exceeded on this machine", errno.EROFS: "this machine's file system is read-only",
}


def _local_exhaustion(link: BaseException) -> Classification | None:
    if isinstance(link, MemoryError):
        return Classification(False, "resource_exhausted", None, "this machine is out of memory (MemoryError)")
    if isinstance(link, OSError) and link.errno in _LOCAL_EXHAUSTION:
        return Classification(False, "resource_exhausted", None,
                              f"{errno.errorcode[link.errno]}: {_LOCAL_EXHAUSTION[link.errno]}")
    return None


_TRANSIENT_LABELS = frozenset({"RetryableWriteError", "TransientTransactionError", "RetryableReadError",
                               "SystemOverloadedError", "RetryableError"})


def _labels(exc: BaseException) -> frozenset[str]:
    held = getattr(exc, "_error_labels", None) or getattr(exc, "error_labels", None)
    labels = {label for label in held if isinstance(label, str)} if isinstance(held, (set, frozenset, list, tuple)) \
        else set()
    has_label = getattr(exc, "has_error_label", None)
    if callable(has_label):
        labels.update(label for label in _TRANSIENT_LABELS if has_label(label) is True)
    return frozenset(labels)


def _code_name(code: str) -> Classification | None:
    """A string ``code`` spelled as an errno name, a gRPC status or an LLM provider's error type."""
    number = getattr(errno, code, None) if code.isupper() and code.startswith("E") else None
    if isinstance(number, int):
        if number in _RETRYABLE_ERRNOS:
            return Classification(True, _RETRYABLE_ERRNOS[number], None, f"code {code}")
        if number in _PERMANENT_ERRNOS:
            return Classification(False, _PERMANENT_ERRNOS[number], None, f"code {code}")
    named = GRPC_CODES.get(code) or PROVIDER_ERROR_TYPES.get(code)
    return Classification(named.retryable, named.category, None, f"code {code}: {named.reason}") if named else None


def _item_statuses(held: object) -> list[int]:
    """The HTTP statuses of a bulk answer's per-item errors (``[{"index": {"status": 429, ...}}]``)."""
    items = held.values() if isinstance(held, dict) else held if isinstance(held, (list, tuple)) else ()
    statuses = []
    for item in items:
        for entry in (item, *item.values()) if isinstance(item, dict) else ():
            status = entry.get("status") if isinstance(entry, dict) else None
            if isinstance(status, int) and not isinstance(status, bool) and 300 <= status <= 599:
                statuses.append(status)
                break
    return statuses


def _generic_facts(link: BaseException) -> Classification | None:
    """What any exception may carry, whatever its library: error labels, a ``timeout`` flag, a string
    ``code``, an ``errno`` (an OS one, or one outside the OS's range that is an HTTP status), and the
    statuses of a bulk answer's per-item errors (transient only when every item is)."""
    labels = _labels(link)
    if labels & _TRANSIENT_LABELS:
        return Classification(True, "database_transient", None, f"error label {min(labels & _TRANSIENT_LABELS)}")
    if getattr(link, "timeout", None) is True:
        return Classification(True, "timeout", None, f"{type(link).__name__}: timeout=True")
    code = getattr(link, "code", None)
    if isinstance(code, str) and code:
        found = _code_name(code)
        if found is not None:
            return found
    number = getattr(link, "errno", None)
    if isinstance(number, int) and not isinstance(number, bool) and not isinstance(link, OSError) \
            and number in _RETRYABLE_ERRNOS | _PERMANENT_ERRNOS.keys():
        retryable = number in _RETRYABLE_ERRNOS
        return Classification(retryable, (_RETRYABLE_ERRNOS if retryable else _PERMANENT_ERRNOS)[number], None,
                              f"errno {errno.errorcode[number]}")
    if isinstance(number, int) and 300 <= number <= 599 and number not in errno.errorcode:
        return http_classification(number, f"{type(link).__name__}: HTTP {number} (in errno)")
    held = getattr(link, "errors", None)
    statuses = _item_statuses(held) if held and not callable(held) else []
    if statuses:
        verdicts = [http_classification(status, f"{len(statuses)} item error(s), HTTP {status}") for status in statuses]
        return next((v for v in verdicts if not v.retryable), verdicts[0])
    return None


_NAME_HINTS = (("Timeout", Classification(True, "timeout", None, "the class name says Timeout")),
               ("TimedOut", Classification(True, "timeout", None, "the class name says TimedOut")),
               ("Reconnect", Classification(True, "connection", None, "the class name says Reconnect")))


def _name_hint(link: BaseException) -> Classification | None:
    """The weakest signal: a class whose own name says it is a timeout or asks to reconnect."""
    name = type(link).__name__
    for hint, verdict in _NAME_HINTS:
        if hint in name:
            return verdict
    return None


def _structural(exc: BaseException) -> Classification | None:
    """Tier 1: what the exception's type and codes say, without reading its message."""
    name = type(exc).__name__
    state = _sqlstate(exc)
    if state is not None:
        return _from_sqlstate(state)
    if getattr(exc, "connection_invalidated", False) is True:
        return Classification(True, "database_transient", None, "database connection invalidated")

    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        text = str(exc).lower()
        if code in (5, 6, 261, 262, 517) or "database is locked" in text or "database table is locked" in text:
            return Classification(True, "database_transient", None, "sqlite database is locked")
        if isinstance(exc, sqlite3.IntegrityError):
            return Classification(False, "validation", None, "sqlite integrity constraint violation")
        return Classification(False, "client_error", None, f"sqlite {name}")

    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return Classification(True, "connection", None, "TLS connection closed by the peer")
    if isinstance(exc, ssl.SSLError) or name == "SSLError":  # requests/urllib3 wrap ssl.SSLError in their own
        return Classification(False, "tls", None, "TLS handshake failed")
    if isinstance(exc, socket.gaierror) or name == "NameResolutionError":
        return Classification(True, "connection", None, "DNS resolution failed")

    # a library's own types say more than the builtins they extend
    for judge in families.active().judges("structure", type(exc)):
        verdict = judge(exc)
        if verdict is not None:
            return verdict
    if isinstance(exc, TimeoutError):
        return Classification(True, "timeout", None, f"{name}: timed out")
    if isinstance(exc, ConnectionError):  # refused, reset, aborted, broken pipe, http.client.RemoteDisconnected
        return Classification(True, "connection", None, name)
    if isinstance(exc, OSError) and exc.errno in _RETRYABLE_ERRNOS:
        return Classification(True, _RETRYABLE_ERRNOS[exc.errno], None, errno.errorcode.get(exc.errno, "OSError"))
    if isinstance(exc, EOFError):  # asyncio.IncompleteReadError: the connection dropped mid-read
        return Classification(True, "connection", None, f"{name}: connection lost")

    if name == "BadStatusLine" or name == "UnknownProtocol":  # http.client: the peer does not speak HTTP
        return Classification(False, "protocol", None, "the peer does not speak HTTP")
    if "OutOfMemory" in name or name in ("CudaError", "CUDAError"):
        return Classification(True, "gpu", None, f"{name}: GPU out of memory")
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return Classification(False, _PERMANENT_ERRNOS[exc.errno], None, errno.errorcode.get(exc.errno, "OSError"))
    if isinstance(exc, _LOGIC_ERRORS):
        return Classification(False, "validation", None, f"{name}: a logic or validation error")
    return None


# Words count only on their own: not glued to identifier characters (``lock_timeout``,
# ``x-ratelimit-remaining``, ``/v1/busy``, ``retry.timeout``).
_L, _R = r"(?<![\w./\\-])", r"(?![\w/\\-])"


def _words(pattern: str) -> str:
    return f"{_L}(?:{pattern}){_R}"


_STATUS_IN_TEXT = re.compile(
    r"(?i)(?:\bHTTP(?:/\d(?:\.\d)?)?\s*(?:status\s*)?(?:code\s*)?[:=]?\s*|\bstatus(?:[ _]code)?\s*[:=]?\s*"
    r"|\berror\s+code\s*[:=]?\s*|\bresponse\s+code\s*[:=]?\s*)(?P<code>[1-5]\d\d)(?![\w.-])"
)
_STATUS_WITH_PHRASE = re.compile(
    r"(?i)(?<![\w./-])(?P<code>[1-5]\d\d)\s+(?:service unavailable|bad gateway|gateway time-?out"
    r"|internal server error|too many requests|request time-?out|unauthorized|forbidden|not found|bad request)\b"
)
_PERMANENT_PATTERNS: tuple[tuple[re.Pattern[str], Classification], ...] = tuple(
    (re.compile(_words(pattern), re.IGNORECASE), cls)
    for pattern, cls in (
        (r'database "[^"]*" does not exist|role "[^"]*" does not exist|no such table|no such column',
         Classification(False, "not_found", None, "the database or object does not exist")),
        (r"password authentication failed|authentication failed|invalid api key|incorrect api key"
         r"|unauthori[sz]ed|permission denied",
         Classification(False, "auth", None, "not authorized")),
        # the server's answer to a bad ``options`` value at connection startup (no SQLSTATE reaches the client)
        (r"unrecognized configuration parameter|invalid value for parameter",
         Classification(False, "configuration", None, "invalid connection option")),
        (r"wrong version number|certificate verify failed|ssl handshake|tls handshake|record layer failure",
         Classification(False, "tls", None, "TLS handshake failed")),
        (r"illegal status line|invalid http|bad status line|unknown url type|no scheme supplied"
         r"|missing an 'http://' or 'https://' protocol|invalid url|no connection adapters|no host given",
         Classification(False, "configuration", None, "bad URL or a peer that does not speak HTTP")),
        (r"maximum context length|context length exceeded|context_length_exceeded",
         Classification(False, "validation", None, "context length exceeded")),
    )
)
_TRANSIENT_PATTERNS: tuple[tuple[re.Pattern[str], Classification], ...] = tuple(
    (re.compile(_words(pattern), re.IGNORECASE), cls)
    for pattern, cls in (
        (r"rate[ -]?limit(?:ed|s|ing)?(?: (?:reached|exceeded))?|too many requests|quota exceeded"
         r"|(?:request|connection) rate exceeded",
         Classification(True, "rate_limit", None, "rate limited")),
        (r"service (?:is )?(?:temporarily )?(?:busy|unavailable)|server (?:is )?(?:busy|overloaded|unavailable)"
         r"|overloaded(?:_error)?|model is overloaded|the server had an error",
         Classification(True, "server_error", None, "service busy or unavailable")),
        (r"cuda (?:error|out of memory)|gpu (?:error|out of memory)|cudnn(?: error|_status_\w+)|cublas_status_\w+",
         Classification(True, "gpu", None, "GPU error")),
        (r"out of memory|cannot allocate memory",
         Classification(True, "resource_exhausted", None, "out of memory")),
        (r"deadlock detected|could not serialize access|database is locked|too many connections"
         r"|maximum connections exceeded"
         r"|terminating connection due to administrator command|server closed the connection unexpectedly"
         r"|connection (?:is|was|has been) (?:closed|lost)|lost connection",
         Classification(True, "database_transient", None, "transient database error")),
        (r"connection (?:refused|reset|aborted|closed unexpectedly|timed out)|broken pipe|network is unreachable"
         r"|no route to host|no such host|name or service not known|temporary failure in name resolution"
         r"|server disconnected|remote end closed connection|unexpected eof",
         Classification(True, "connection", None, "connection failed")),
        (r"(?:operation|request|read|write|connect|connection|pool|i/o|socket) timed? ?out|timed out"
         r"|deadline exceeded|timeout (?:error|exceeded|expired|occurred)|due to (?:statement|lock) timeout",
         Classification(True, "timeout", None, "timed out")),
    )
)


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return ""


def _from_message(exc: BaseException) -> Classification | None:
    """Tier 2: the words of the message. A misconfiguration named in it beats a network word."""
    text = _text(exc)
    if not text:
        return None
    for regex, result in _PERMANENT_PATTERNS:
        if regex.search(text):
            return result
    for regex in (_STATUS_IN_TEXT, _STATUS_WITH_PHRASE):
        match = regex.search(text)
        if match:
            return http_classification(int(match.group("code")), f"HTTP {match.group('code')} (from message)",
                                       from_words=True)
    for regex, result in _TRANSIENT_PATTERNS:
        if regex.search(text):
            return result
    return None


def _from_wrapper(exc: BaseException) -> Classification | None:
    """Tier 3: a transport wrapper whose chain said nothing more specific."""
    for judge in families.active().judges("wrapper", type(exc)):
        verdict = judge(exc)
        if verdict is not None:
            return verdict
    return None


def _decide(chain: list[BaseException], judge: families.Judge) -> Classification | None:
    """Any transient verdict of the tier wins; else the outermost permanent one."""
    verdicts = [v for v in (judge(link) for link in chain) if v is not None]
    for verdict in verdicts:
        if verdict.retryable:
            return verdict
    return verdicts[0] if verdicts else None


def _group(group: BaseExceptionGroup) -> Classification:
    """A group is transient only when every member is; else what its first permanent member is."""
    verdicts = [classify(member) for member in group.exceptions]
    for verdict in verdicts:
        if not verdict.retryable:
            return Classification(False, verdict.category, verdict.status_code,
                                  f"exception group: {verdict.reason}")
    first = verdicts[0] if verdicts else Classification(False, "unknown", None, "empty")
    return Classification(bool(verdicts), first.category, first.status_code, f"exception group: {first.reason}")


def _facts(link: BaseException) -> Classification | None:
    """What one exception carries that decides like an HTTP status: codes before words."""
    category = getattr(link, "category", None)
    if isinstance(category, str) and category in CATEGORIES and isinstance(link, ClassifiedError):
        return Classification(link.retryable, category, link.status_code, type(link).__name__)
    if isinstance(link, BaseExceptionGroup):
        return _group(link)
    for judge in families.active().judges("facts", type(link)):
        verdict = judge(link)
        if verdict is not None:
            return verdict
    verdict = _generic_facts(link)
    if verdict is not None:
        return verdict
    status = _status_of(link)
    if status is not None and status >= 300:  # an error reported inside a 200 is judged by what it says
        return http_classification(status)
    return None


def _classify(exc: BaseException) -> Classification:
    chain = list(_chain(exc))
    found = user_verdict(chain)
    if found is not None:
        return found
    for link in chain:
        local = _local_exhaustion(link)
        if local is not None:
            return local
    flag: bool | None = None
    for link in chain:
        flag = _explicit_flag(link)
        if flag is not None:
            break
    for link in chain:
        found = _facts(link)
        if found is not None:
            break
    if found is None:
        for judge in (_structural, _from_message, _from_wrapper, _name_hint):
            found = _decide(chain, judge)
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
        return Classification(False, "unknown", None,
                              f"classifier could not inspect the error ({type(failure).__name__})")


def is_retryable(exc: BaseException) -> bool:
    return classify(exc).retryable


RETRY_AFTER_STATUSES = frozenset({429, 503})


_DELTA_SECONDS = re.compile(r"[0-9]+")


def parse_retry_after(value: object, *, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from ``now`` (epoch seconds): delta-seconds or an HTTP date; None if invalid."""
    if value is None:
        return None
    text = str(value).strip()
    # RFC 9110 allows only ASCII digits or an HTTP date; str.isdigit() would also accept "²" or "١", which
    # float() then refuses with a ValueError out of the retry wait.
    if not text or not text.isascii():
        return None
    if _DELTA_SECONDS.fullmatch(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def retry_after_header(exc: BaseException) -> float | str | None:
    """What a 429 or 503 in the chain said in ``Retry-After``, as sent (seconds or an HTTP date)."""
    for link in _chain(exc):
        explicit = getattr(link, "retry_after", None)
        if isinstance(explicit, (int, float, str)) and not isinstance(explicit, bool):
            return explicit
        if _status_of(link) not in RETRY_AFTER_STATUSES:
            continue
        response = getattr(link, "response", None)
        headers = getattr(response, "headers", None) or getattr(link, "headers", None)
        if headers is None:
            continue
        try:
            value = headers.get("Retry-After")
        except Exception:
            continue
        if value is not None:
            return str(value)
    return None


def retry_after_of(exc: BaseException, *, now: float | None = None) -> float | None:
    """The ``Retry-After`` a 429 or 503 in the chain asked for, in seconds from ``now``; None when none."""
    value = retry_after_header(exc)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            return None
        return max(0.0, seconds) if math.isfinite(seconds) else None
    return parse_retry_after(value, now=now)


def _told(cause: BaseException | str) -> str:
    """What an error says, with the words of a classified error it was raised from (``raise ... from``) when it
    does not say them itself: an SDK wraps whatever its transport raised in its own "Connection error.", and the
    reason the transport gave (an outage budget spent, an unreadable answer) is what a user needs to read."""
    text = str(cause)
    if isinstance(cause, ClassifiedError) or not isinstance(cause, BaseException):
        return text
    try:
        inner = cause.__cause__
        for _ in range(8):
            if inner is None:
                return text
            if isinstance(inner, ClassifiedError):
                said = getattr(inner, "detail", None)  # a subclass may skip our __init__: its words are optional
                if not isinstance(said, str) or not said or said in text:
                    return text
                return f"{text}: {said}" if text else said
            inner = inner.__cause__
    except Exception:  # noqa: BLE001 - a hostile error's attributes never break the error being made
        pass
    return text


class ClassifiedError(RecoveryError):
    """An operation failed; the error carries its category, status, model, endpoint and Retry-After."""

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
        retry_after: float | str | None = None,
    ) -> None:
        found = classify(cause) if isinstance(cause, BaseException) else None
        self.category = category or (found.category if found else "unknown")
        self.status_code = status_code if status_code is not None else (found.status_code if found else None)
        self.retryable = retryable if retryable is not None else (found.retryable if found else False)
        self.model = model
        self.endpoint = endpoint
        self.retry_after = retry_after
        detail = message if message is not None else (_told(cause) if cause is not None else self.category)
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
    return ClassifiedError(exc, model=model, endpoint=endpoint, retry_after=retry_after_header(exc))
