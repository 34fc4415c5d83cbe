"""An invalid setting at definitions load: one clear line naming the setting, not a long traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("value,expected", [
    ("nan", "recovery_ext.ConfigurationError: RECOVERY_HEARTBEAT_INTERVAL: a duration must be a finite number"),
    ("100", "recovery_ext.ConfigurationError: invalid RecoveryResource settings: heartbeat interval (100.0 s) must be "
            "at most half the timeout (90.0 s)"),
])
def test_importing_the_definitions_ends_in_one_line_naming_the_setting(value, expected, tmp_path):
    result = load([sys.executable, "-c", "import definitions"],
                  {"RECOVERY_HEARTBEAT_INTERVAL": value, "DAGSTER_HOME": str(tmp_path)}, ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines[-1].startswith(expected), result.stderr
    assert "RECOVERY_HEARTBEAT_INTERVAL" in lines[-1]
    assert len(lines) <= 10 and "pydantic" not in result.stderr, result.stderr


def test_dagster_definitions_validate_shows_the_one_line(tmp_path):
    dagster = Path(sys.executable).parent / "dagster"
    result = load([str(dagster), "definitions", "validate", "-f", str(ROOT / "definitions.py")],
                  {"RECOVERY_HEARTBEAT_INTERVAL": "100", "DAGSTER_HOME": str(tmp_path)}, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "recovery_ext.ConfigurationError: invalid RecoveryResource settings: heartbeat interval (100.0 s)" in output
    assert "[from RECOVERY_HEARTBEAT_INTERVAL=100]" in output
    assert "pydantic" not in output and "validate_python" not in output, output
