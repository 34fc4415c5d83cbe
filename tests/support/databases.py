"""Throw-away PostgreSQL databases on the test server, for fixtures and for subprocess helpers alike."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

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
