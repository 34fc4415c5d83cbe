"""SQLAlchemy: a pool timeout waits, a bad URL or unknown dialect does not."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    return Family(structure=by_type([
        (loaded_types("sqlalchemy.exc", "TimeoutError"), transient("timeout", "sqlalchemy: pool timed out")),
        (loaded_types("sqlalchemy.exc", "ArgumentError", "NoSuchModuleError"),
         permanent("configuration", "sqlalchemy: bad URL or unknown dialect")),
    ]))
