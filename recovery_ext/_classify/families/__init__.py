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

from recovery_ext._classify.verdict import Classification

Judge = Callable[[BaseException], "Classification | None"]


@dataclass(frozen=True)
class Family:
    facts: Judge | None = None
    structure: Judge | None = None
    wrapper: Judge | None = None
    inner: Callable[[BaseException], BaseException | None] | None = None


@dataclass(frozen=True)
class Active:
    facts: tuple[Judge, ...] = ()
    structure: tuple[Judge, ...] = ()
    wrapper: tuple[Judge, ...] = ()
    inner: tuple[Callable[[BaseException], BaseException | None], ...] = ()


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
    _cache.clear()


_cache: dict[str, object] = {}


def active() -> Active:
    """The judges of every family whose library is imported; rebuilt only when that set changes."""
    size = len(sys.modules)
    if _cache.get("size") == size:
        return _cache["active"]  # type: ignore[return-value]
    present = tuple(lib for libs in _REGISTRY.values() for lib in libs if lib in sys.modules)
    if _cache.get("present") != present or "active" not in _cache:
        families = [importlib.import_module(name if "." in name else f"{__name__}.{name}").family()
                    for name, libs in _REGISTRY.items() if any(lib in sys.modules for lib in libs)]
        _cache["active"] = Active(*(tuple(getattr(f, point) for f in families if getattr(f, point) is not None)
                                    for point in ("facts", "structure", "wrapper", "inner")))
        _cache["present"] = present
    _cache["size"] = size
    return _cache["active"]  # type: ignore[return-value]


# The provider SDKs first: their error codes are more specific than the HTTP libraries they ride on.
register_family("anthropic", "anthropic")
register_family("openai", "openai")
register_family("botocore", "botocore")
register_family("google_api_core", "google.api_core.exceptions")
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
register_family("dagster", "dagster")
