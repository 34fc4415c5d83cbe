"""`recovery-ext metrics serve` as its own process: it answers scrapes and stops on SIGTERM, and a busy port or a
missing extra is one clear line. What each metric counts is tested in process, in tests/dagster/test_metrics.py."""

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

from observe_scenario import crash_and_resume

from recovery_ext._errors import install_hint
from recovery_ext._store.store import RecoveryStore
from recovery_pipelines.devserver import wait_for

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture
def migrated_sqlite_url(sqlite_url):
    """The CLI refuses a SQLite file that does not exist (only `migrate` creates one)."""
    store = RecoveryStore(sqlite_url)
    store.migrate()
    store.close()
    return sqlite_url


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
