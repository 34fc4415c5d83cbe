"""Numbered SQL migrations per dialect: ``sql/<dialect>/NNNN_name.sql``.

The library's own live in the repository's top-level ``sql/`` folder (installed into the wheel as
``recovery_ext/_sql``), are applied in order, each in its own transaction, and are recorded in
``rx_schema_migrations``. The same folder holds the few hot-path statements the store runs as fixed
SQL text (``sql/<dialect>/queries/<name>.sql``) and each dialect's current ``schema.sql``.

An application keeps its own tables in its own package (``<package>/sql/<dialect>/NNNN_*.sql``),
numbered on their own and recorded in ``rx_app_migrations`` under the package's name, so the
library's numbering never has to know about them.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from importlib import metadata, resources
from importlib.resources.abc import Traversable
from pathlib import Path

from sqlalchemy import Engine, Table, insert, inspect, select
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._store.dialects import Dialect
# Migration as itself: `migrations.Migration` is how the store's lifecycle names what it applied.
from recovery_ext._store.models import Migration as Migration
from recovery_ext._errors import ConfigurationError, MigrationError
from recovery_ext._store.schema import app_migrations_table, migrations_table

_FILE_PATTERN = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")




LIBRARY = "recovery_ext._store"


def _library_sql() -> Traversable:
    """The library's SQL: ``recovery_ext/_sql`` in an installed wheel, else the checkout's top-level ``sql/``.

    Two places because an editable install runs from the checkout, where the SQL sits beside the package
    (as the design card lays it out), while a wheel must carry it inside the package.
    """
    packaged = resources.files("recovery_ext").joinpath("_sql")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "sql"


_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_package(package: object) -> str:
    """``package`` as an importable package that holds a ``sql/`` folder of migrations, or a one-line
    ConfigurationError (a typo, an empty name, a plain module such as ``os``)."""
    if not isinstance(package, str) or not _PACKAGE_NAME.fullmatch(package):
        raise ConfigurationError(f"a migrations package must be a dotted Python package name, got {package!r}")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"no migrations package {package!r}: {exc}") from None
    if spec is None:
        raise ConfigurationError(f"no migrations package {package!r}: no such package is installed")
    if spec.submodule_search_locations is None:
        raise ConfigurationError(f"{package!r} is a module, not a package with sql/<dialect>/NNNN_name.sql migrations")
    if not _sql_root(package).is_dir():
        raise ConfigurationError(f"package {package!r} has no sql/ folder of migrations (sql/<dialect>/NNNN_name.sql)")
    return package


def _sql_root(package: str = LIBRARY) -> Traversable:
    if package == LIBRARY:
        return _library_sql()
    try:
        return resources.files(package).joinpath("sql")
    except ModuleNotFoundError as exc:
        raise MigrationError(f"no migrations package {package!r}: {exc}") from exc


def load_migrations(dialect: Dialect, package: str = LIBRARY) -> list[Migration]:
    folder = _sql_root(package).joinpath(dialect.migrations_folder)
    if not folder.is_dir():
        raise MigrationError(f"no migrations folder for {dialect.name} in {package}: {folder}")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_PATTERN.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(
            f"migrations for {dialect.name} in {package} must be numbered 0001, 0002, ... without gaps: {versions}")
    return found


@functools.cache
def load_query(folder: str, name: str) -> str:
    """The statement ``sql/<folder>/queries/<name>.sql`` without its comment lines, its ``\\ir <part>.sql``
    lines replaced by that file's statement (psql's include, relative to the file): the parts the checkpoint
    statements share are written once.

    Comments go because psycopg caches the parsing of a query only up to 4 KiB of text (and a
    ``%`` in a comment would be read as a placeholder).
    """
    return _expanded(folder, name, ())


_INCLUDED_PART = re.compile(r"[A-Za-z0-9_]+\.sql")


def _expanded(folder: str, name: str, including: tuple[str, ...]) -> str:
    """``name``'s statement with its includes expanded; ``including``: the files whose includes led here."""
    path = _sql_root().joinpath(folder).joinpath("queries").joinpath(f"{name}.sql")
    if not path.is_file():
        raise MigrationError(f"no query {name!r} for {folder}: {path}")
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:1] == ["\\ir"]:
            part = words[1] if len(words) == 2 else ""
            if not _INCLUDED_PART.fullmatch(part):
                raise MigrationError(f"query {name!r} for {folder}: \\ir takes one file of the same folder: {line!r}")
            if part.removesuffix(".sql") in (*including, name):
                raise MigrationError(f"query {name!r} for {folder}: {part} includes itself "
                                     f"({' -> '.join((*including, name, part))})")
            line = _expanded(folder, part.removesuffix(".sql"), (*including, name))
        elif line.strip().startswith("--"):
            continue
        lines.append(line)
    return "\n".join(lines).strip()


def _tracking(package: str) -> tuple[Table, ColumnElement[bool], dict[str, str]]:
    """The table that records a package's applied migrations, and the condition selecting its rows."""
    if package == LIBRARY:
        return migrations_table, migrations_table.c.version.is_not(None), {}
    return app_migrations_table, app_migrations_table.c.package == package, {"package": package}


def applied_versions(engine: Engine, package: str = LIBRARY) -> set[int]:
    table, mine, _ = _tracking(package)
    if not inspect(engine).has_table(table.name):
        return set()
    with engine.connect() as conn:
        return set(conn.scalars(select(table.c.version).where(mine)))


def check_not_newer(engine: Engine, dialect: Dialect, package: str = LIBRARY) -> None:
    """Refuse a database that a newer release migrated: its tables are not what this code reads and writes."""
    _refuse_newer(load_migrations(dialect, package), applied_versions(engine, package), package)


def _refuse_newer(known: list[Migration], done: set[int], package: str) -> None:
    unknown = sorted(done - {m.version for m in known})
    if unknown:
        of = "" if package == LIBRARY else f" of {package}"
        raise MigrationError(
            f"the database's schema{of} is at version {max(done):04d}, newer than this release knows "
            f"({known[-1].version if known else 0:04d}, recovery-ext {_release()}): it was migrated by a newer "
            f"release; upgrade recovery-ext to use it")


def _release() -> str:
    try:
        return metadata.version("recovery-ext")
    except metadata.PackageNotFoundError:
        return "unknown"


def pending_migrations(engine: Engine, dialect: Dialect, package: str = LIBRARY) -> list[Migration]:
    check_not_newer(engine, dialect, package)
    done = applied_versions(engine, package)
    return [m for m in load_migrations(dialect, package) if m.version not in done]


def apply_migrations(engine: Engine, dialect: Dialect, package: str = LIBRARY) -> list[Migration]:
    """Apply what is not yet applied; safe to call from several processes at once."""
    table, mine, key = _tracking(package)
    known = load_migrations(dialect, package)
    done = applied_versions(engine, package)
    _refuse_newer(known, done, package)
    if {m.version for m in known} <= done:
        # Every store and every run's resource migrates on open: an up-to-date database is one read, with no
        # lock and no write transaction. An applied migration is never unapplied, so nothing can be missed.
        return []
    with engine.connect().execution_options(rx_write=True) as conn, conn.begin():
        dialect.migration_lock(conn)
        table.create(conn, checkfirst=True)
    applied: list[Migration] = []
    for migration in known:
        if migration.version in done:
            continue
        with engine.connect().execution_options(rx_write=True) as conn, conn.begin():
            dialect.migration_lock(conn)
            already = conn.scalar(select(table.c.version).where(mine, table.c.version == migration.version))
            if already is not None:
                continue
            for statement in migration.statements():
                try:
                    conn.exec_driver_sql(statement)
                except Exception as exc:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} of {package} failed: {exc}"
                    ) from exc
            conn.execute(insert(table).values(
                version=migration.version, name=migration.name, applied_at=dialect.now(), **key))
        applied.append(migration)
    return applied
