"""psycopg 3, psycopg2 and psycopg_pool; SQLSTATE codes themselves are read by the core."""

from __future__ import annotations

import sys
from typing import Any

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient


def family() -> Family:
    operational = loaded_types("psycopg", "OperationalError")
    pq = sys.modules.get("psycopg.pq")
    typed = by_type([(loaded_types("psycopg_pool", "PoolTimeout") + loaded_types("psycopg", "errors.ConnectionTimeout"),
                      transient("timeout", "psycopg: timed out"))])

    def structure(exc: BaseException) -> Classification | None:
        if operational and isinstance(exc, operational) and _refused_parameters(exc, pq):
            return permanent("configuration", "invalid connection parameters (refused by libpq before contacting "
                                              "a server)")
        return typed(exc) if typed else None

    return Family(
        structure=structure,
        wrapper=by_type([(operational + loaded_types("psycopg2", "OperationalError"),
                          transient("database_transient", "database unreachable"))]),
    )


def _refused_parameters(exc: BaseException, pq: Any) -> bool:
    """libpq's ``PQconnectStart`` rejected the connection parameters (an invalid ``sslmode``, port
    number, keepalive value ...) before any server was contacted: the error still holds that
    connection, open and bad. A connection attempt that reached the network holds a finished copy."""
    pgconn = getattr(exc, "pgconn", None)
    if pgconn is None or pq is None or type(pgconn).__name__ == "FinishedPGconn":
        return False
    try:
        return bool(pgconn.status == pq.ConnStatus.BAD)
    except Exception:  # noqa: BLE001 - an unexpected connection object says nothing
        return False
