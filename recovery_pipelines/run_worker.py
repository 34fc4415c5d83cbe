"""Find the process that runs a Dagster run (its run worker), to crash it on purpose.

With Dagster's ``DefaultRunLauncher`` the run worker is a child process of the code server
(``dagster api grpc``): a ``multiprocessing`` child whose command line is ``python -c "from
multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`` and names no run (a code
location loaded without a code server starts ``dagster api execute_run <args>`` instead, whose
arguments hold the run id). Either way the run worker announces itself as the first engine event of
its run: "Started process for run (pid: N)." (the run's page in the UI shows it), and that is where
its pid is read from: only that event of Dagster's (the whole message, the pid in its data), never
another event quoting the text. The process is then proven that run's worker before it is named:
alive, ``dagster api execute_run`` naming the run or a multiprocessing child of a Dagster code
server, and started no later than that event, so a pid the system reused is never killed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

from recovery_ext import redact

PID_EVENT = re.compile(r"Started process for run \(pid: ([0-9]{1,10})\)\.")
LIVE = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)
CLOCK_SLACK = 5.0  # seconds between the process start and its event (clock granularity, a busy machine)


class RunWorkerNotFound(Exception):
    """No live run worker for that run; the message says why."""


@dataclass(frozen=True)
class RunWorker:
    pid: int
    command: str
    announced_at: float  # when the run logged "Started process for run (pid: N)", epoch seconds


def announced_pid(instance: DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """The pid the run's worker announced in the run's log, and when; None before it started.

    Only Dagster's own process-start event counts: a run-level engine event whose whole message is
    "Started process for run (pid: N)." and whose data records that pid (``EngineEventData.in_process``).
    Any other event may quote that text (a provider's error in an outage event): it names no process
    of ours. The process is then proven the run's worker before anything is done to it
    (:func:`find_run_worker`).
    """
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        event = record.dagster_event
        match = PID_EVENT.fullmatch((record.message or "").strip())
        if match is None or event is None or record.step_key is not None:
            continue
        metadata = getattr(event.event_specific_data, "metadata", None) or {}
        if getattr(metadata.get("pid"), "value", None) == match.group(1):
            return int(match.group(1)), record.timestamp
    return None


def parent_command(pid: int) -> str | None:
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return command_line(parent)


def is_runs_worker(pid: int, command: str, run_id: str) -> bool:
    """Whether process ``pid`` (``command``) is the run worker of ``run_id``: ``dagster api execute_run``
    whose arguments name the run, or a multiprocessing child of a Dagster code server (how a code
    server starts a run worker; its step processes are children of the run worker instead)."""
    if "dagster api execute_run" in command:
        return run_id in command
    if "multiprocessing" not in command:
        return False
    parent = parent_command(pid) or ""
    return "dagster" in parent and ("api grpc" in parent or "code-server" in parent)


def command_line(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def started_at(pid: int) -> float | None:
    """The process's start time (epoch seconds), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    state, ticks = fields[0], int(fields[19])
    if state == "Z":
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def find_run_worker(instance: DagsterInstance, run_id: str) -> RunWorker:
    """The live run worker of ``run_id``; raises RunWorkerNotFound saying why there is none."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise RunWorkerNotFound(f"no run {run_id} in the Dagster instance at {instance.root_directory}")
    if run.status not in LIVE:
        raise RunWorkerNotFound(f"run {run_id} is {run.status.value}, not running: it has no run worker to kill")
    found = announced_pid(instance, run_id)
    if found is None:
        raise RunWorkerNotFound(f"run {run_id} has not started its run worker yet (no \"Started process for run\" "
                                "event in its log); try again in a moment")
    pid, announced = found
    command = command_line(pid)
    if command is None:
        raise RunWorkerNotFound(f"the run worker of run {run_id} (pid {pid}) is no longer running")
    if not is_runs_worker(pid, command, run_id):
        raise RunWorkerNotFound(f"pid {pid} of run {run_id} is not that run's worker ({redact(command)[:80]}); "
                                "not killing it")
    began = started_at(pid)
    if began is not None and began > announced + CLOCK_SLACK:
        raise RunWorkerNotFound(f"pid {pid} of run {run_id} was reused by a process started after the run "
                                "worker; not killing it")
    return RunWorker(pid, command, announced)
