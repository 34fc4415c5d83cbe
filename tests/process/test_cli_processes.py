"""The operator CLI as a separate process: `events --follow` streaming, a rejected call writing no Dagster home, a
reader that goes away before the first line, and `migrate --package` typos (each a fresh interpreter, so an
import it attempts cannot be already done). A Python start per test, so they run in tests/process; the CLI's
answers to each command are tested in process, in tests/store/test_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_events_and_follow(cli, store, db_url):
    store.record_event("recovery_started", {"trigger": "test"})
    assert "recovery_started" in cli("events").stdout
    follower = subprocess.Popen([sys.executable, "-m", "recovery_ext._cli", "--database-url", db_url, "events",
                                 "--follow", "--json", "--interval", "0.2", "--kind", "item_dead"],
                                stdout=subprocess.PIPE, text=True)
    try:
        store.record_event("item_dead", {"queue": "ocr"})
        line = follower.stdout.readline()
        assert json.loads(line)["kind"] == "item_dead"
    finally:
        # SIGKILL: the follower has nothing to clean up, and a SIGTERM can be lost to a disposition this
        # process passed on (it stayed running past the wait once, after the process-tier tests ran first)
        follower.kill()
        follower.wait(10)


def run_cli(*args, cwd, env=None):
    environment = {k: v for k, v in os.environ.items() if k not in ("RECOVERY_DATABASE_URL", "DAGSTER_HOME")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "recovery_ext._cli", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["status", "--help"], ["status", "--threshold", "nope"],
                                  ["reset-stuck", "--threshold", "0"], ["events", "--limit", "0"]])
def test_a_rejected_or_help_call_creates_no_dagster_home(args, tmp_path):
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode in (0, 2), result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["events"], ["pipelines", "list"]])
def test_a_closed_pipe_ends_quietly_with_exit_0(args, store, db_url, tmp_path):
    for i in range(30):
        store.record_event("note", {"n": i})
    proc = subprocess.Popen([sys.executable, "-m", "recovery_ext._cli", "--database-url", db_url, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.close()  # the reader is gone before the first line: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0 and err == ""


@pytest.mark.parametrize("package, says", [
    ("typo_pkg", "no migrations package 'typo_pkg': no such package is installed"),
    ("", "a migrations package must be a dotted Python package name, got ''"),
    ("os", "'os' is a module, not a package"),
    ("json", "package 'json' has no sql/ folder of migrations"),
    ("a..b", "must be a dotted Python package name"),
])
def test_a_bad_migrations_package_is_a_usage_error_that_creates_nothing(package, says, tmp_path):
    result = run_cli("migrate", "--package", package, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "unexpected error" not in result.stderr
    assert "run `recovery-ext migrate`" not in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no ./.dagster_home, no database
