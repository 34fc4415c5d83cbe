"""`recovery-ext metrics serve` as its own process: it answers scrapes and stops on SIGTERM, it comes up while its
database is down, silent or locked and reports it up once it is back, and a busy port or a missing extra is one
clear line. What each metric counts is tested in process, in tests/dagster/test_metrics.py."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from sqlalchemy.engine import make_url

from observe_scenario import crash_and_resume
from tcp_gate import TcpGate

from recovery_ext._errors import install_hint
from recovery_ext._store.store import RecoveryStore
from recovery_pipelines.devserver import wait_for

ROOT = Path(__file__).resolve().parents[2]
UP = re.compile(r"^recovery_database_up (\S+)$", re.MULTILINE)


def _serve(db_url: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recovery_ext._cli", "--database-url", db_url, "metrics", "serve",
                             "--host", "127.0.0.1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_serve_answers_scrapes_and_stops_on_sigterm(store, db_url):
    crash_and_resume(store)
    proc = _serve(db_url, "--port", "0")
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/metrics", line).group(0)
        body = wait_for(lambda: requests.get(url, timeout=5).text, timeout=20, what="the exporter")
        assert 'recovery_reclaims_total{cause="heartbeat"} 1.0' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _migrated(url: str) -> str:
    store = RecoveryStore(url)
    store.migrate()
    store.close()
    return url


@pytest.fixture
def migrated_sqlite_url(sqlite_url):
    """The CLI refuses a SQLite file that does not exist (only `migrate` creates one)."""
    return _migrated(sqlite_url)


def test_serve_on_a_busy_port_fails_with_one_clear_line(migrated_sqlite_url):
    sqlite_url = migrated_sqlite_url
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _serve(sqlite_url, "--port", str(taken.getsockname()[1]))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "cannot listen on 127.0.0.1" in err and "Traceback" not in err


def test_serve_without_the_metrics_extra_says_how_to_install_it(tmp_path, migrated_sqlite_url):
    sqlite_url = migrated_sqlite_url
    # A prometheus_client that cannot be imported, as in an install without the extra.
    (tmp_path / "prometheus_client").mkdir()
    (tmp_path / "prometheus_client" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named "
                                                                "'prometheus_client'\", name='prometheus_client')\n")
    proc = _serve(sqlite_url, "--port", "0", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert install_hint("metrics") in err and "Traceback" not in err


def _served_url(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/metrics", line)
    if not found:
        proc.wait(timeout=60)
        pytest.fail(f"the exporter did not come up (exit {proc.returncode}): {line!r} {proc.stderr.read()}")
    return found.group(0)


def _database_up(url: str) -> float:
    return float(UP.search(requests.get(url, timeout=15).text).group(1))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def migrated_pg_url(pg_url):
    return _migrated(pg_url)


@pytest.mark.parametrize("outage", ["refuses connections", "never answers"])
def test_serve_started_while_postgres_is_down_serves_up_0_then_up_1_once_it_is_back(migrated_pg_url, outage):
    """An exporter never dies with its database: it listens before it touches the database, each scrape says
    whether the database could be read, and the same process reports it up once it answers again."""
    gate = TcpGate()
    if outage == "never answers":
        gate.blackhole()
    real = make_url(migrated_pg_url)
    proc = _serve(real.set(port=gate.port).render_as_string(hide_password=False), "--port", "0")
    try:
        url = _served_url(proc)
        assert _database_up(url) == 0.0
        assert proc.poll() is None, proc.stderr.read()
        gate.forward_to(real.port or 5432)
        wait_for(lambda: _database_up(url) == 1.0, timeout=60, what="recovery_database_up 1 once PostgreSQL is back")
    finally:
        _stop(proc)
        gate.close()
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr.read()


HOLD_THE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode = EXCLUSIVE")   # readers are locked out too, WAL or not
conn.execute("BEGIN EXCLUSIVE")
conn.execute("CREATE TABLE held_by_another_process (x)")
print("locked", flush=True)
sys.stdin.read()
"""


def test_serve_started_while_another_process_holds_the_sqlite_lock_comes_up(migrated_sqlite_url):
    path = make_url(migrated_sqlite_url).database
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    proc = None
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = _serve(migrated_sqlite_url, "--port", "0")
        url = _served_url(proc)
        assert _database_up(url) == 0.0
        holder.stdin.close()
        holder.wait(timeout=20)
        wait_for(lambda: _database_up(url) == 1.0, timeout=60, what="recovery_database_up 1 once the lock is released")
    finally:
        if proc is not None:
            _stop(proc)
        holder.kill()
        holder.wait()
    assert proc.returncode == 0
