"""`make dev` stops with one clear line when its LLM stand-in's port is taken.

The stand-in runs in the background: without the check, it printed its error and `dagster dev` started
anyway, its LLM calls sent to whatever program held the port (on a shared machine, another user's
stand-in).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from recovery_pipelines.devserver import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_make_dev_refuses_a_taken_stand_in_port_before_dagster_dev_starts(tmp_path):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERY_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(tmp_path / "dagster_home")
    make = subprocess.Popen(["make", "dev", f"PORT={free_port()}", f"DEMO_LLM_PORT={port}"], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = make.communicate(timeout=240)
    finally:
        if make.poll() is None:  # it started dagster dev after all: stop it, the test fails below
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        held.close()
    assert make.returncode != 0, output
    assert f"demo LLM: cannot listen on 127.0.0.1:{port}" in output and "make dev DEMO_LLM_PORT=" in output, output
    assert "Launching Dagster services" not in output and "dagster dev" not in output.split("cannot listen")[1]
