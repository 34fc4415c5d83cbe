"""asyncpg: SQLSTATE codes are read by the core; these are its client-side errors."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient


def family() -> Family:
    types = partial(loaded_types, "asyncpg.exceptions")
    typed = by_type([
        # the schema changed under a cached statement: asyncpg's documentation says to retry
        (types("InvalidCachedStatementError", "OutdatedSchemaCacheError"),
         transient("database_transient", "asyncpg: cached statement outdated")),
        (types("ClientConfigurationError"), permanent("configuration", "asyncpg: invalid client configuration")),
    ])
    interface = types("InterfaceError")

    def structure(exc: BaseException) -> Classification | None:
        verdict = typed(exc) if typed else None
        if verdict is None and interface and isinstance(exc, interface):
            if "connection is closed" in str(exc) or "connection was closed" in str(exc):
                return transient("connection", "asyncpg: the connection is closed")
            return permanent("client_error", "asyncpg: misuse of the connection")
        return verdict

    return Family(structure=structure)
