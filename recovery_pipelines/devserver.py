"""A real `dagster dev` (webserver, daemon, code server) on 127.0.0.1, for the crash demo, the
end-to-end tests and the benchmarks. It runs in its own session and stops with everything it started."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from recovery_pipelines.run_worker import announced_pid
import contextlib

BIN = Path(sys.executable).parent
ENDED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
WHY = {"RUN_FAILURE", "STEP_FAILURE", "ENGINE_EVENT", "RUN_CANCELED"}  # what says why a run ended as it did


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Callable[[], Any], *, timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll until ``condition()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - servers come up and go down under these tests
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f" (last error: {last_error})"
                                                                              if last_error else ""))


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


class DagsterDev:
    def __init__(self, defs_file: Path, home: Path, env: dict[str, str], *, workspace: bool = False,
                 port: int | None = None) -> None:
        self.defs_file = defs_file
        self.workspace = workspace
        self.home = home
        self.port = port or free_port()
        self.env = {**os.environ, **env, "DAGSTER_HOME": str(home)}
        self.proc: subprocess.Popen | None = None
        self.log_path = home / "dagster-dev.log"

    def start(self, timeout: float = 120) -> DagsterDev:
        self.home.mkdir(parents=True, exist_ok=True)
        if not (self.home / "dagster.yaml").exists():
            (self.home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        log = open(self.log_path, "w")  # noqa: SIM115 - the server writes to it for its whole life
        self.proc = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(self.port),
             "-w" if self.workspace else "-f", str(self.defs_file)],
            cwd=str(self.defs_file.parent), env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        # imported here: the helpers above (wait_for, free_port) serve installs without the webserver's client
        from dagster_graphql import DagsterGraphQLClient

        self.client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        try:
            wait_for(self._location_loaded, timeout=timeout, interval=0.5,
                     what=f"dagster dev to load the code location (log: {self.log_path})")
        except BaseException:
            self.stop()
            raise
        self.instance = DagsterInstance.from_config(str(self.home))
        return self

    def _location_loaded(self) -> bool:
        query = (
            "{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename } } } } }"
        )
        data = self.client._execute(query)
        entries = data["workspaceOrError"]["locationEntries"]
        if entries and entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation":
            self.location = entries[0]["name"]
            return True
        return False

    def reload(self) -> None:
        """Bring the code location back after its server died (the first reload may answer with an error)."""
        def reloaded() -> bool:
            try:
                self.client.reload_repository_location(self.location)
            except Exception:  # noqa: BLE001
                return False
            return self._location_loaded()

        wait_for(reloaded, timeout=90, interval=1.0, what="the code location to reload")

    def launch(self, job: str, run_config: dict, tags: dict | None = None) -> str:
        return self.client.submit_job_execution(job, run_config=run_config, tags=tags or {})

    def run_worker_pid(self, run_id: str) -> int | None:
        """The run worker's pid, from the engine event Dagster logs when execution starts."""
        found = announced_pid(self.instance, run_id)
        return found[0] if found else None

    def run(self, run_id: str):
        return self.instance.get_run_by_id(run_id)

    def runs(self, tags: dict[str, str] | None = None, statuses=None, job_name: str | None = None):
        return self.instance.get_runs(filters=RunsFilter(tags=tags or {}, statuses=statuses or [], job_name=job_name))

    def wait_run(self, run_id: str, statuses=(DagsterRunStatus.SUCCESS,), timeout: float = 120):
        """Poll until the run reaches one of ``statuses``; fail at once, saying why, if it ends in another."""
        def reached():
            run = self.run(run_id)
            if run is not None and (run.status in statuses or run.status in ENDED):
                return run
            return None

        run = wait_for(reached, timeout=timeout, what=f"run {run_id} to reach {statuses}")
        if run.status not in statuses:
            raise AssertionError(f"run {run_id} ended {run.status.value}, not {statuses}: {self.why_ended(run_id)}")
        return run

    def why_ended(self, run_id: str, last: int = 4) -> str:
        """The run's last error and failure messages, for a test that expected another ending."""
        messages = [e.message or (e.dagster_event.message if e.dagster_event else "")
                    for e in self.instance.all_logs(run_id)
                    if e.level >= logging.ERROR or (e.dagster_event and e.dagster_event.event_type_value in WHY)]
        return " | ".join(m.strip()[:400] for m in messages[-last:] if m) or "(no error recorded)"

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None
