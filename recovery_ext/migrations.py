"""Numbered SQL migrations per dialect: ``sql/<dialect>/NNNN_name.sql``.

They are applied in order, each in its own transaction, and recorded in
``rx_schema_migrations``. The wheel carries them as ``recovery_ext/sql``; a source
checkout reads the top-level ``sql/`` folder. The same folder holds the few hot-path
statements the store runs as fixed SQL text: ``sql/<dialect>/queries/<name>.sql``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from sqlalchemy import Engine, insert, inspect, select

from .dialects import Dialect
from .errors import MigrationError
from .schema import migrations_table

_FILE_PATTERN = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    def statements(self) -> list[str]:
        """Split on semicolons that end a line, except inside a dollar-quoted function body."""
        parts: list[str] = []
        current: list[str] = []
        quoted = False
        for line in self.sql.splitlines():
            if not quoted and line.strip().startswith("--"):
                continue
            current.append(line)
            quoted ^= line.count("$$") % 2 == 1
            if not quoted and line.rstrip().endswith(";"):
                parts.append("\n".join(current).strip().removesuffix(";").strip())
                current = []
        parts.append("\n".join(current).strip().removesuffix(";").strip())
        return [part for part in parts if part]


def _sql_root() -> Traversable:
    packaged = resources.files("recovery_ext").joinpath("sql")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sql"


def load_migrations(dialect: Dialect) -> list[Migration]:
    folder = _sql_root().joinpath(dialect.migrations_folder)
    if not folder.is_dir():
        raise MigrationError(f"no migrations folder for {dialect.name}: {folder}")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_PATTERN.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations for {dialect.name} must be numbered 0001, 0002, ... without gaps: {versions}")
    return found


@functools.cache
def load_query(folder: str, name: str) -> str:
    """The statement ``sql/<folder>/queries/<name>.sql`` without its comment lines.

    Comments go because psycopg caches the parsing of a query only up to 4 KiB of text (and a
    ``%`` in a comment would be read as a placeholder).
    """
    path = _sql_root().joinpath(folder).joinpath("queries").joinpath(f"{name}.sql")
    if not path.is_file():
        raise MigrationError(f"no query {name!r} for {folder}: {path}")
    lines = (line for line in path.read_text(encoding="utf-8").splitlines() if not line.strip().startswith("--"))
    return "\n".join(lines).strip()


def applied_versions(engine: Engine) -> set[int]:
    if not inspect(engine).has_table(migrations_table.name):
        return set()
    with engine.connect() as conn:
        return set(conn.scalars(select(migrations_table.c.version)))


def pending_migrations(engine: Engine, dialect: Dialect) -> list[Migration]:
    done = applied_versions(engine)
    return [m for m in load_migrations(dialect) if m.version not in done]


def apply_migrations(engine: Engine, dialect: Dialect) -> list[Migration]:
    """Apply what is not yet applied; safe to call from several processes at once."""
    with engine.connect().execution_options(rx_write=True) as conn:
        with conn.begin():
            dialect.migration_lock(conn)
            migrations_table.create(conn, checkfirst=True)
    applied: list[Migration] = []
    for migration in load_migrations(dialect):
        with engine.connect().execution_options(rx_write=True) as conn:
            with conn.begin():
                dialect.migration_lock(conn)
                already = conn.scalar(
                    select(migrations_table.c.version).where(migrations_table.c.version == migration.version)
                )
                if already is not None:
                    continue
                for statement in migration.statements():
                    try:
                        conn.exec_driver_sql(statement)
                    except Exception as exc:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                        ) from exc
                conn.execute(
                    insert(migrations_table).values(
                        version=migration.version, name=migration.name, applied_at=dialect.now()
                    )
                )
        applied.append(migration)
    return applied
