"""The migrations produce exactly the schema the store's Core tables describe."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from sqlalchemy import inspect

from recovery_ext.dialects import Dialect
from recovery_ext.migrations import load_migrations
from recovery_ext.schema import metadata
from recovery_ext.store import RecoveryStore


def test_migrations_create_exactly_the_tables_and_columns_the_store_uses(store):
    insp = inspect(store.engine)
    tables = set(insp.get_table_names())
    assert tables == set(metadata.tables)
    for table in metadata.sorted_tables:
        if table.name == "rx_schema_migrations":
            continue
        actual = {c["name"]: c for c in insp.get_columns(table.name)}
        assert set(actual) == {c.name for c in table.columns}, table.name
        for column in table.columns:
            if column.primary_key:
                continue
            assert actual[column.name]["nullable"] == column.nullable, f"{table.name}.{column.name}"
        assert {tuple(c) for c in [insp.get_pk_constraint(table.name)["constrained_columns"]]} == {
            tuple(c.name for c in table.primary_key.columns)
        }


def test_every_live_scan_has_an_index(store):
    insp = inspect(store.engine)
    names = {ix["name"] for t in ("rx_pipelines", "rx_nodes", "rx_queue_items") for ix in insp.get_indexes(t)}
    assert {"rx_pipelines_live", "rx_nodes_running", "rx_nodes_stalled", "rx_queue_ready",
            "rx_queue_processing", "rx_queue_dead"} <= names


def test_migrate_is_recorded_and_idempotent(store):
    assert store.pending_migrations() == []
    assert store.migrate() == []
    with store.read() as conn:
        versions = [r[0] for r in conn.exec_driver_sql("SELECT version FROM rx_schema_migrations")]
    assert versions == [m.version for m in load_migrations(store.dialect)]


def test_concurrent_migrators_apply_once(db_url):
    from concurrent.futures import ThreadPoolExecutor

    stores = [RecoveryStore(db_url) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda s: s.migrate(), stores))
    assert sum(len(r) for r in results) == len(load_migrations(stores[0].dialect))
    for s in stores:
        s.close()


def test_both_dialects_have_the_same_migration_numbers():
    pg = load_migrations(Dialect.for_url("postgresql://x@localhost/db"))
    lite = load_migrations(Dialect.for_url("sqlite://"))
    assert [(m.version, m.name) for m in pg] == [(m.version, m.name) for m in lite]


def test_wheel_ships_the_migrations(tmp_path):
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    "."], check=True)
    wheel = next(out.glob("recovery_ext-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "recovery_ext/sql/postgres/0001_init.sql" in names
    assert "recovery_ext/sql/sqlite/0001_init.sql" in names
