"""Shared fixtures: a fresh store on SQLite and on a real PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from hog import cpu_hog as _cpu_hog

from recovery_ext._store.store import RecoveryStore

PG_ADMIN_URL = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture(scope="session")
def pg_admin() -> str:
    """The PostgreSQL server the tests use; an unreachable server fails the tests, it does not skip them."""
    try:
        with psycopg.connect(_pg_conninfo(PG_ADMIN_URL), connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {PG_ADMIN_URL} (start it with .ci/run): {exc}")
    return PG_ADMIN_URL


def create_pg_database(admin_url: str) -> str:
    name = f"rx_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_pg_conninfo(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    return f"{base}/{name}"


def drop_pg_database(admin_url: str, url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(_pg_conninfo(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh, uniquely named database, dropped afterwards whatever happened."""
    url = create_pg_database(admin_url)
    try:
        yield url
    finally:
        drop_pg_database(admin_url, url)


@pytest.fixture
def pg_url(pg_admin) -> Iterator[str]:
    with pg_database(pg_admin) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'recovery.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'recovery.sqlite3'}"
    else:
        with pg_database(request.getfixturevalue("pg_admin")) as url:
            yield url


@pytest.fixture
def store(db_url) -> Iterator[RecoveryStore]:
    s = RecoveryStore(db_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def cpu_hog():
    """One busy process per core for the duration of the test (see tests/hog.py)."""
    with _cpu_hog() as procs:
        yield procs


@pytest.fixture(scope="module")
def cpu_hog_module():
    """The same hog, kept running for a whole module (e.g. around a shared `dagster dev`)."""
    with _cpu_hog() as procs:
        yield procs


@pytest.fixture(scope="module")
def app_url(pg_admin) -> Iterator[str]:
    """One PostgreSQL database for a whole module, e.g. around a module-scoped `dagster dev`."""
    with pg_database(pg_admin) as url:
        yield url


@pytest.fixture(scope="module")
def app_store(app_url) -> Iterator[RecoveryStore]:
    """The migrated store over ``app_url``, shared by the module's tests."""
    s = RecoveryStore(app_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()
