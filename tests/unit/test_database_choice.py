"""The suite's database switch (``RX_TEST_DATABASES``): a bad value stops it with a usage error, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value", ["mysql", ",", "sqlite,oracle"])
def test_a_database_that_is_no_dialect_stops_the_suite_with_one_line(value):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           str(TESTS / "unit" / "test_retry.py")], capture_output=True, text=True, timeout=120,
                          cwd=TESTS.parent, env={**os.environ, "RX_TEST_DATABASES": value})
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert f"ERROR: RX_TEST_DATABASES must name some of sqlite, postgresql, not {value!r}" in output
    assert "Traceback" not in output and "conftest" not in output, output
