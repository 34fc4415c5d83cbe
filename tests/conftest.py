"""Fixtures every folder shares: a fresh store on SQLite and on a real PostgreSQL database per test, a local
Dagster instance per test, CPU hogs.

Each folder's own conftest.py holds what only its tests use and marks its tests with the folder's cost
(``unit``, ``store``, ``dagster``, ``process``, ``e2e``), so ``pytest -m 'not e2e'`` selects by cost as well as by path.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, instance_for_test
from databases import PG_ADMIN_URL, MigratedPostgres, MigratedSqlite, pg_conninfo, pg_database
from hog import cpu_hog as _cpu_hog

from recovery_ext._cli import main
from recovery_ext._store.store import RecoveryStore


@pytest.fixture(scope="session", autouse=True)
def alembic_scripts_read_once() -> Iterator[None]:
    """Dagster reads its alembic revision files again for every SQLite storage it opens and for every run's event
    log shard: a sixth of an in-process run's time here. The files cannot change during a session, so each test
    process reads them once. What Dagster then does with them (check, stamp, migrate) is unchanged."""
    from alembic.script import ScriptDirectory

    read = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]
    directories: dict[tuple[str | None, str | None], ScriptDirectory] = {}
    lock = threading.Lock()

    def from_config(cls, config):
        key = (config.get_main_option("script_location"), config.get_main_option("version_locations"))
        with lock:
            if key not in directories:
                directories[key] = read(cls, config)
            return directories[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ScriptDirectory, "from_config", classmethod(from_config))
        yield


@pytest.fixture(scope="session", autouse=True)
def private_dagster_home(tmp_path_factory) -> Iterator[None]:
    """Tests never write into the checkout's .dagster_home (``make`` exports it): an in-process run records
    itself in $DAGSTER_HOME's instance. A test that needs a home of its own sets one."""
    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(tmp_path_factory.mktemp("dagster_home"))
    yield
    if before is None:
        os.environ.pop("DAGSTER_HOME", None)
    else:
        os.environ["DAGSTER_HOME"] = before


@pytest.fixture(scope="session")
def pg_admin() -> str:
    """The PostgreSQL server the tests use; an unreachable server fails the tests, it does not skip them."""
    try:
        with psycopg.connect(pg_conninfo(PG_ADMIN_URL), connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {PG_ADMIN_URL} (start it with .ci/run): {exc}")
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_admin) -> Iterator[str]:
    with pg_database(pg_admin) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'recovery.sqlite3'}"


@pytest.fixture(scope="session")
def migrated_postgres(pg_admin) -> Iterator[MigratedPostgres]:
    pool = MigratedPostgres(pg_admin)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> MigratedSqlite:
    return MigratedSqlite(tmp_path_factory.mktemp("migrated_sqlite"))


DATABASES = ("sqlite", "postgresql")
DATABASES_ENV = "RX_TEST_DATABASES"


def chosen_databases() -> list[str] | None:
    """The dialects ``db_url`` runs each test on: both by default; ``RX_TEST_DATABASES=postgresql`` (a comma list)
    for a pass whose point is something else, such as CI's runs on the oldest and newest Dagster, whose tests
    already ran on both databases under the main Dagster. None when it names no dialect, or one that is not."""
    raw = os.environ.get(DATABASES_ENV, ",".join(DATABASES))
    chosen = [name.strip() for name in raw.split(",") if name.strip()]
    return chosen if chosen and all(name in DATABASES for name in chosen) else None


def pytest_configure(config: pytest.Config) -> None:
    """A bad ``RX_TEST_DATABASES`` stops the suite before it collects, with a one-line usage error."""
    if chosen_databases() is None:
        raise pytest.UsageError(f"{DATABASES_ENV} must name some of {', '.join(DATABASES)}, not "
                                f"{os.environ.get(DATABASES_ENV)!r}")


@pytest.fixture(params=chosen_databases() or DATABASES)  # a bad value never gets here: pytest_configure stops
def db_url(request, tmp_path) -> Iterator[str]:
    """The test's database on each dialect: empty, or already migrated when the test uses the ``store`` (a copy
    of a migrated SQLite file, an emptied migrated PostgreSQL database), since migrating costs more than the
    test itself."""
    migrated = "store" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "recovery.sqlite3"
        yield request.getfixturevalue("migrated_sqlite").copy_to(path) if migrated else f"sqlite:///{path}"
    elif migrated:
        with request.getfixturevalue("migrated_postgres").lend() as url:
            yield url
            forget_shared_store(url)
    else:
        with pg_database(request.getfixturevalue("pg_admin")) as url:
            yield url


def forget_shared_store(url: str) -> None:
    """Close the store this process's ops and sensors shared over ``url`` (one per URL per process): the next
    test that borrows the database starts with no pool, settings or migrated packages left from this one."""
    resources = sys.modules.get("recovery_ext._dagster.resources")
    if resources is None:
        return
    with resources._stores_lock:
        shared = resources._stores.pop(url, None)
        resources._migrated_packages.difference_update({key for key in resources._migrated_packages if key[0] == url})
    if shared is not None:
        shared.close()


@pytest.fixture
def store(db_url) -> Iterator[RecoveryStore]:
    s = RecoveryStore(db_url)
    s.migrate()  # nothing left to apply; it still checks the lent database is this code's
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def cli(store, db_url):
    """``cli(*args, code=0)``: run ``recovery-ext`` on the test's database and check its exit status."""
    runner = CliRunner()

    def invoke(*args, code=0):
        result = runner.invoke(main, ["--database-url", db_url, *args], catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result

    return invoke


@pytest.fixture
def cpu_hog():
    """One busy process per core for the duration of the test (see tests/support/hog.py)."""
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



COSTS = ("unit", "store", "dagster", "process", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test carries its folder's cost as a marker."""
    for item in items:
        cost = item.path.parent.name
        if cost in COSTS:
            item.add_marker(getattr(pytest.mark, cost))


@pytest.fixture(scope="session")
def instance_home(tmp_path_factory) -> Path:
    """A Dagster home whose SQLite storages are created once: creating them takes seconds, copying them none."""
    home = tmp_path_factory.mktemp("instance_home")
    with instance_for_test(temp_dir=str(home)):
        pass
    return home


@pytest.fixture
def instance(instance_home, tmp_path_factory) -> Iterator[DagsterInstance]:
    """A real local Dagster instance in a home of the test's own: SQLite storage and the DefaultRunLauncher."""
    home = tmp_path_factory.mktemp("dagster_home")
    shutil.copytree(instance_home, home, dirs_exist_ok=True)
    with instance_for_test(temp_dir=str(home)) as inst:
        yield inst
