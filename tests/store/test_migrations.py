"""The migrations produce exactly the schema the store's Core tables describe."""

from __future__ import annotations


from sqlalchemy import inspect

import pytest

from recovery_ext._errors import MigrationError
from recovery_ext._store.dialects import Dialect
from recovery_ext._store.migrations import LIBRARY
from recovery_pipelines.ontology_schema import MIGRATIONS
from recovery_pipelines.ontology_schema import metadata as ontology_metadata
from recovery_ext._store.migrations import load_migrations
from recovery_ext._store.schema import metadata
from recovery_ext._store.store import RecoveryStore


def test_migrations_create_exactly_the_tables_and_columns_the_store_uses(store):
    assert set(inspect(store.engine).get_table_names()) == set(metadata.tables)
    _assert_tables_match(store, metadata)


def _assert_tables_match(store, schema):
    insp = inspect(store.engine)
    for table in schema.sorted_tables:
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


def test_migrating_an_up_to_date_database_only_reads(store):
    """Every store and every run's resource migrates when it opens: on an up-to-date database that must take no
    lock and open no write transaction (it took one locked transaction per migration)."""
    from sqlalchemy import event

    statements: list[str] = []
    begins: list[object] = []

    def seen(conn, cursor, statement, *args):
        statements.append(statement)

    def began(conn):
        begins.append(conn.get_execution_options().get("rx_write"))

    event.listen(store.engine, "before_cursor_execute", seen)
    event.listen(store.engine, "begin", began)
    try:
        assert store.migrate() == []
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
        event.remove(store.engine, "begin", began)
    reads = ("SELECT", "PRAGMA", "BEGIN DEFERRED")
    assert statements and all(s.lstrip().upper().startswith(reads) for s in statements), statements
    assert not any("lock" in s.lower() for s in statements), statements
    assert not any(begins), begins  # no write transaction (BEGIN IMMEDIATE on SQLite)


def test_concurrent_migrators_apply_once(db_url):
    from concurrent.futures import ThreadPoolExecutor

    stores = [RecoveryStore(db_url) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda s: s.migrate(), stores))
    assert sum(len(r) for r in results) == len(load_migrations(stores[0].dialect))
    for s in stores:
        s.close()


@pytest.mark.parametrize("package", [LIBRARY, MIGRATIONS])
def test_both_dialects_have_the_same_migration_numbers(package):
    pg = load_migrations(Dialect.for_url("postgresql://x@localhost/db"), package)
    lite = load_migrations(Dialect.for_url("sqlite://"), package)
    assert [(m.version, m.name) for m in pg] == [(m.version, m.name) for m in lite]


def test_the_library_creates_no_application_table(store):
    """The demo's ontology tables come from its own package's migrations, not the library's."""
    assert not [name for name in inspect(store.engine).get_table_names() if name.startswith("rx_ont_")]


def test_an_application_package_migrates_its_own_tables_apart(store):
    applied = store.migrate(MIGRATIONS)
    assert [m.name for m in applied] == ["ontology"]
    assert store.migrate(MIGRATIONS) == [] and store.pending_migrations(MIGRATIONS) == []
    _assert_tables_match(store, ontology_metadata)
    with store.read() as conn:
        rows = conn.exec_driver_sql("SELECT package, version, name FROM rx_app_migrations").all()
        library = [r[0] for r in conn.exec_driver_sql("SELECT version FROM rx_schema_migrations")]
    assert [tuple(r) for r in rows] == [(MIGRATIONS, 1, "ontology")]
    assert library == [m.version for m in load_migrations(store.dialect)]


def test_an_unknown_migration_package_is_a_clear_error(store):
    with pytest.raises(MigrationError, match="no migrations package 'no_such_package'"):
        store.migrate("no_such_package")


def test_existing_pipelines_migrate_into_the_default_deployment(db_url):
    """Rows written before deployments existed belong to 'default' (and are adopted by the first
    deployment whose Dagster instance knows their run)."""
    from recovery_ext._store.migrations import apply_migrations

    store = RecoveryStore(db_url)
    before = [m for m in load_migrations(store.dialect) if m.version < 11]  # as before deployments existed
    assert [m.version for m in before][-1] == 10
    with store.engine.begin() as conn:
        from recovery_ext._store.schema import migrations_table

        migrations_table.create(conn)
        for m in before:
            for statement in m.statements():
                conn.exec_driver_sql(statement)
            conn.execute(migrations_table.insert().values(version=m.version, name=m.name,
                                                          applied_at=store.dialect.now()))
        conn.exec_driver_sql("INSERT INTO rx_pipelines (job_name, status, params, owner, epoch, resume_count, "
                             "max_resumes, created_at, updated_at) VALUES ('old_job', 'running', '{}', 'r0', 1, 0, "
                             "3, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
    applied = apply_migrations(store.engine, store.dialect)
    assert [m.name for m in applied][0] == "deployment"
    (old,) = store.reports.list_pipelines()
    assert old.job_name == "old_job" and old.deployment == "default"
    store.close()
