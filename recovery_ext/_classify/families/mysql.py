"""MySQL and MariaDB drivers (PyMySQL, mysqlclient, mysql-connector): the server's errno decides.

Transient: connection loss and refusal, too many connections, lock waits, deadlocks, interrupted
or timed-out statements, a server shutting down or read-only during a failover, out of memory.
Every other errno (access denied, unknown database or table, syntax, duplicates) is permanent.
"""

from __future__ import annotations

from recovery_ext._classify.families import Family, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient

_TRANSIENT = {
    1040: ("resource_exhausted", "too many connections"), 1203: ("resource_exhausted", "too many user connections"),
    1226: ("resource_exhausted", "user resource limit exceeded"), 1205: ("database_transient", "lock wait timeout"),
    1213: ("database_transient", "deadlock"), 3572: ("database_transient", "lock not available (NOWAIT)"),
    1020: ("database_transient", "record changed since last read"), 1053: ("connection", "server shutdown"),
    1152: ("connection", "connection aborted"), 1158: ("connection", "network read error"),
    1159: ("timeout", "network read timeout"), 1160: ("connection", "network write error"),
    1161: ("timeout", "network write timeout"), 1317: ("database_transient", "query interrupted"),
    1927: ("connection", "connection killed"), 1969: ("timeout", "max_statement_time exceeded"),
    3024: ("timeout", "max_execution_time exceeded"), 4031: ("connection", "disconnected for inactivity"),
    1290: ("database_transient", "server is read-only (failover)"), 1836: ("database_transient", "server is read-only"),
    1615: ("database_transient", "prepared statement needs re-preparing"),
    1037: ("resource_exhausted", "out of memory"),
    1038: ("resource_exhausted", "out of sort memory"), 1041: ("resource_exhausted", "out of memory"),
    1021: ("resource_exhausted", "disk full"), 1135: ("resource_exhausted", "cannot create a thread"),
    1461: ("resource_exhausted", "too many prepared statements"),
    1637: ("resource_exhausted", "too many active concurrent transactions"), 2002: ("connection", "cannot connect"),
    2003: ("connection", "cannot connect"), 2005: ("connection", "unknown host"),
    2006: ("connection", "server gone away"),
    2013: ("connection", "lost connection"), 2055: ("connection", "lost connection"),
}
_PERMANENT = {1044: "auth", 1045: "auth", 1142: "auth", 1049: "not_found", 1146: "not_found", 1054: "not_found",
              1062: "validation", 1452: "validation", 1451: "validation", 1048: "validation", 1406: "validation",
              1064: "client_error"}


def errno_of(exc: BaseException) -> int | None:
    code = getattr(exc, "errno", None)
    if not isinstance(code, int) and exc.args:
        code = exc.args[0]
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def family() -> Family:
    errors = (loaded_types("pymysql.err", "MySQLError") + loaded_types("MySQLdb", "MySQLError")
              + loaded_types("mysql.connector", "Error"))
    interface = loaded_types("pymysql.err", "InterfaceError") + loaded_types("MySQLdb", "InterfaceError")

    def facts(exc: BaseException) -> Classification | None:
        if not errors or not isinstance(exc, errors):
            return None
        code = errno_of(exc)
        if code in _TRANSIENT:
            category, what = _TRANSIENT[code]
            return transient(category, f"MySQL {code}: {what}")
        if code == 0 and interface and isinstance(exc, interface):
            return transient("connection", "MySQL: the connection is closed")
        if code is not None and code > 0:
            return permanent(_PERMANENT.get(code, "client_error"), f"MySQL error {code}")
        return None

    return Family(facts=facts)
