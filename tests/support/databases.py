"""Throw-away PostgreSQL databases on the test server, for fixtures and for subprocess helpers alike, and the
migrated databases the ``store`` fixture lends: migrated once per session, emptied between tests."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from recovery_ext._store.store import RecoveryStore

PG_ADMIN_URL = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def pg_conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def create_pg_database(admin_url: str) -> str:
    name = f"rx_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_conninfo(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    return f"{base}/{name}"


def drop_pg_database(admin_url: str, url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_conninfo(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def pg_database(admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """A fresh, uniquely named database, dropped afterwards whatever happened."""
    url = create_pg_database(admin_url)
    try:
        yield url
    finally:
        drop_pg_database(admin_url, url)


def migrate(url: str) -> None:
    store = RecoveryStore(url)
    try:
        store.migrate()
    finally:
        store.close()


# Everything in the public schema that a migration creates, and the migrations recorded: a test that changed
# any of it (dropped a table, replaced a function, applied an application's migration) leaves a database that
# is no longer "freshly migrated".
_SHAPE = """
SELECT md5(coalesce(string_agg(line, E'\\n' ORDER BY line), '')) FROM (
  SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' '
         || coalesce(column_default, '') AS line
    FROM information_schema.columns WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'trigger ' || tgrelid::regclass::text || ' ' || tgname || ' ' || tgenabled::text FROM pg_trigger
   WHERE NOT tgisinternal
  UNION ALL SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL SELECT 'sequence ' || sequence_schema || '.' || sequence_name FROM information_schema.sequences
  UNION ALL SELECT 'view ' || table_schema || '.' || table_name FROM information_schema.views
   WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'setting ' || array_to_string(setconfig, ',') FROM pg_db_role_setting
   WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT 'migration ' || row_to_json(m)::text FROM rx_schema_migrations m
) shape
"""


class MigratedPostgres:
    """PostgreSQL databases migrated once and lent to one test at a time, emptied when given back.

    Creating, migrating and dropping a database per test costs seconds on a busy server (DROP DATABASE waits for
    a checkpoint); emptying one costs milliseconds. A database is lent again only when it is exactly as migration
    left it but for its rows: a test that changed its shape, or left a connection open behind it (a process
    that might still write), gets its database dropped instead.
    """

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.free: list[str] = []
        self.shapes: dict[str, str] = {}

    @contextmanager
    def lend(self) -> Iterator[str]:
        url = self.free.pop() if self.free else self._create()
        try:
            yield url
        finally:
            if self._give_back(url):
                self.free.append(url)
            else:
                self.shapes.pop(url, None)
                drop_pg_database(self.admin_url, url)

    def close(self) -> None:
        while self.free:
            drop_pg_database(self.admin_url, self.free.pop())

    def _create(self) -> str:
        url = create_pg_database(self.admin_url)
        migrate(url)
        with psycopg.connect(pg_conninfo(url)) as conn:
            self.shapes[url] = conn.execute(_SHAPE).fetchone()[0]
        return url

    def _give_back(self, url: str) -> bool:
        """Empty ``url`` for the next test; False when it cannot be trusted to be as migrated."""
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(pg_conninfo(self.admin_url), autocommit=True) as admin:
            left_open = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'", (name,)
            ).fetchone()[0]
        if left_open:
            return False
        try:
            with psycopg.connect(pg_conninfo(url)) as conn:
                if conn.execute(_SHAPE).fetchone()[0] != self.shapes[url]:
                    return False
                # DELETE, not TRUNCATE: a TRUNCATE makes new files for every table and index and costs a
                # second; without triggers (foreign keys, the counters') the order of the tables is free, but for
                # the one trigger that fires even so (a pipeline deleted before its nodes is noted: migration 0024)
                conn.execute("SET LOCAL session_replication_role = replica")
                conn.execute("SET LOCAL synchronous_commit = off")
                for (table,) in conn.execute(
                        "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
                        " WHERE schemaname = 'public' AND tablename <> 'rx_schema_migrations'"
                        " ORDER BY tablename = 'rx_deleted_pipelines'").fetchall():
                    conn.execute(f"DELETE FROM {table}")
                for (sequence,) in conn.execute(
                        "SELECT format('%I.%I', sequence_schema, sequence_name) FROM information_schema.sequences"
                ).fetchall():
                    conn.execute(f"ALTER SEQUENCE {sequence} RESTART")
        except psycopg.Error:
            return False
        return True


class MigratedSqlite:
    """A SQLite file migrated once; each test gets its own copy."""

    def __init__(self, directory: Path) -> None:
        self.template = directory / "migrated.sqlite3"
        migrate(f"sqlite:///{self.template}")

    def copy_to(self, path: Path) -> str:
        shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"
