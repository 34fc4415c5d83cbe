"""``sql/<dialect>/schema.sql`` is what the migrations produce; the built wheel carries the SQL and migrates from it."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import zipfile

import pytest
from schema_dump import SCHEMA_FILES, dump
from sqlalchemy import create_engine, text


def test_the_schema_file_equals_a_freshly_migrated_database(db_url):
    dialect = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    assert dump(db_url) == SCHEMA_FILES[dialect].read_text(encoding="utf-8"), (
        f"{SCHEMA_FILES[dialect]} is stale: run `make schema` after changing a migration")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    root = SCHEMA_FILES["sqlite"].parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(root)], check=True)
    return next(out.glob("recovery_ext-*.whl"))


def test_the_wheel_is_the_library_with_its_sql_and_type_marker(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("recovery_ext/_sql/postgres/0001_init.sql", "recovery_ext/_sql/sqlite/0001_init.sql",
                 "recovery_ext/_sql/postgres/queries/begin_node.sql", "recovery_ext/_sql/postgres/schema.sql",
                 "recovery_ext/py.typed"):
        assert name in names
    assert not [name for name in names if name.split("/")[0] not in {"recovery_ext"} and ".dist-info/" not in name]


def test_the_wheel_registers_only_commands_it_ships(wheel):
    """The demo pipelines stay in the repository: a wheel that registered `demo` warned on every CLI command."""
    archive = zipfile.ZipFile(wheel)
    entry_points = configparser.ConfigParser(delimiters=("=",))
    entry_points.read_string(archive.read(next(n for n in archive.namelist() if n.endswith("entry_points.txt")))
                             .decode())
    shipped = {name.split("/")[0] for name in archive.namelist() if ".dist-info/" not in name}
    assert entry_points["console_scripts"]["recovery-ext"] == "recovery_ext._cli:main"
    commands = entry_points["recovery_ext.commands"] if entry_points.has_section("recovery_ext.commands") else {}
    assert {name: target for name, target in commands.items() if target.split(".")[0] not in shipped} == {}


def test_a_fresh_venv_with_the_wheel_migrates_both_databases(wheel, tmp_path, pg_url):
    """The wheel installed into a new venv, away from the checkout: its own SQL migrates SQLite and PostgreSQL.

    The venv reaches this interpreter's packages (dagster, SQLAlchemy, ...) through a plain path entry, which
    does not process the checkout's editable-install .pth, so only the wheel's recovery_ext can be imported."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    with open(os.path.join(site, "zz_test_deps.pth"), "w") as pth:
        pth.write(ours + "\n")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "RECOVERY_DATABASE_URL"}}
    where = subprocess.run([str(python), "-c", "import recovery_ext; print(recovery_ext.__file__)"], cwd=tmp_path,
                           env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(site), where
    sqlite_url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    for url in (sqlite_url, pg_url):
        done = subprocess.run([str(venv / "bin" / "recovery-ext"), "--database-url", url, "migrate"], cwd=tmp_path,
                              env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "warning" not in done.stderr, done.stderr   # no command registered that the wheel cannot load
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT max(version) FROM rx_schema_migrations")) >= 13
        engine.dispose()
