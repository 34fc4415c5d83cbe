"""Library families: what the errors of one library mean, one small module per library.

A family module defines ``family() -> Family``; it is imported only once one of the libraries it is
registered for is in ``sys.modules`` (an exception cannot come from a library nobody imported), and
it never imports its library itself: it looks the library's types up with :func:`loaded_types`.
Adding a family is one module here and one :func:`register_family` line below.

A family answers at up to four points, each a function of one exception (``None``: no opinion):

* ``facts``: codes that decide the way an HTTP status does (a provider error code, a gRPC status,
  an SMTP reply, a MySQL errno); the outermost exception of a chain that carries one decides;
* ``structure``: what its types say (tier 1 of the chain, any transient verdict wins);
* ``wrapper``: transport wrappers that mean "it did not get through" when nothing they wrap says why;
* ``inner``: an exception it wraps outside ``__cause__`` (a retry helper's last error), walked as a cause.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from recovery_ext._classify.verdict import Classification

Judge = Callable[[BaseException], "Classification | None"]
Unwrap = Callable[[BaseException], "BaseException | None"]
# A point's function as the registry keeps it: a Judge, or an Unwrap at the ``inner`` point.
_Point = Callable[[BaseException], Any]


@dataclass(frozen=True)
class Family:
    facts: Judge | None = None
    structure: Judge | None = None
    wrapper: Judge | None = None
    inner: Unwrap | None = None


_POINTS = ("facts", "structure", "wrapper", "inner")


class Active:
    """The judges of the imported libraries' families, each kept with the top-level packages of its
    libraries: an exception meets only the judges of the packages its class and bases come from."""

    def __init__(self, entries: dict[str, tuple[tuple[frozenset[str], _Point], ...]]) -> None:
        self.entries = entries
        self._by_type: dict[str, dict[type, tuple[_Point, ...]]] = {point: {} for point in _POINTS}

    def judges(self, point: str, kind: type) -> tuple[Judge, ...]:
        """The verdicts of the ``facts``, ``structure`` or ``wrapper`` point that may speak for ``kind``."""
        return self._found(point, kind)

    def unwrappers(self, kind: type) -> tuple[Unwrap, ...]:
        """The ``inner`` point's functions that may hold an exception ``kind`` wraps outside its cause."""
        return self._found("inner", kind)

    def _found(self, point: str, kind: type) -> tuple[_Point, ...]:
        cache = self._by_type[point]
        found = cache.get(kind)
        if found is None:
            roots = {base.__module__.split(".", 1)[0] for base in kind.__mro__}
            found = tuple(judge for packages, judge in self.entries[point] if packages & roots)
            if len(cache) < 4096:  # bounded: classes made on the fly must not grow it forever
                cache[kind] = found
        return found


def loaded_types(module: str, *names: str) -> tuple[type, ...]:
    """The named classes of ``module`` (dotted names allowed) if it is imported; nothing otherwise."""
    found: list[type] = []
    mod = sys.modules.get(module)
    for name in names if mod is not None else ():
        obj = mod
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, type) and obj not in found:
            found.append(obj)
    return tuple(found)


def by_type(table: Iterable[tuple[tuple[type, ...], Classification]]) -> Judge | None:
    """A judge from ``(types, verdict)`` rows, first match wins; None when no row has a loaded type."""
    rows = tuple((types, verdict) for types, verdict in table if types)
    if not rows:
        return None

    def judge(exc: BaseException) -> Classification | None:
        for types, verdict in rows:
            if isinstance(exc, types):
                return verdict
        return None

    return judge


# family module (under this package) -> the libraries whose presence in sys.modules enables it
_REGISTRY: dict[str, tuple[str, ...]] = {}


def register_family(module: str, *libraries: str) -> None:
    """``module``: a family module of this package by its short name, or any module by its dotted path."""
    _REGISTRY[module] = libraries
    forget()


def forget() -> None:
    """Rebuild the active families on next use (after the registry changed)."""
    global _current
    _cache.clear()
    _current = (-1, None)


_cache: dict[str, Any] = {}
_current: tuple[int, Active | None] = (-1, None)  # len(sys.modules) when last built, and what was built


def active() -> Active:
    """The judges of every family whose library is imported; rebuilt only when that set changes."""
    global _current
    size, current = len(sys.modules), _current
    if current[0] == size and current[1] is not None:
        return current[1]
    present = tuple(lib for libs in _REGISTRY.values() for lib in libs if lib in sys.modules)
    if _cache.get("present") != present or "active" not in _cache:
        families = [(frozenset(lib.split(".", 1)[0] for lib in libs),
                     importlib.import_module(name if "." in name else f"{__name__}.{name}").family())
                    for name, libs in _REGISTRY.items() if any(lib in sys.modules for lib in libs)]
        _cache["active"] = Active({point: tuple((roots, getattr(f, point)) for roots, f in families
                                                if getattr(f, point) is not None) for point in _POINTS})
        _cache["present"] = present
    built: Active = _cache["active"]
    _current = (size, built)
    return built


# The provider SDKs first: their error codes are more specific than the HTTP libraries they ride on.
register_family("anthropic", "anthropic")
register_family("openai", "openai")
register_family("botocore", "botocore")
register_family("google_api_core", "google.api_core.exceptions")
register_family("google_genai", "google.genai.errors")
register_family("grpc", "grpc")
register_family("httpx", "httpx", "httpx2", "httpcore", "httpcore2")
register_family("requests", "requests")
register_family("urllib3", "urllib3")
register_family("stdlib_http", "urllib.error", "http.client")
register_family("aiohttp", "aiohttp")
register_family("websockets", "websockets")
register_family("psycopg", "psycopg", "psycopg2", "psycopg_pool")
register_family("sqlalchemy", "sqlalchemy")
register_family("mysql", "pymysql", "MySQLdb", "mysql.connector")
register_family("asyncpg", "asyncpg")
register_family("redis", "redis")
register_family("smtp", "smtplib")
register_family("kombu", "kombu", "amqp")
register_family("pika", "pika")
register_family("ftplib", "ftplib")
register_family("pymongo", "pymongo")
register_family("nats", "nats.errors")
register_family("celery", "celery", "billiard")
register_family("dagster", "dagster")
