"""Find the process that runs a Dagster run (its run worker), to crash it on purpose.

With Dagster's ``DefaultRunLauncher`` the run worker is a child process of the code server
(``dagster api grpc``): a ``multiprocessing`` child whose command line is ``python -c "from
multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`` and names no run (a code
location loaded without a code server starts ``dagster api execute_run <args>`` instead, whose
arguments hold the run id). Either way the run worker announces itself as the first engine event of
its run: "Started process for run (pid: N)." (the run's page in the UI shows it), and that is where
its pid is read from. The process is checked before it is named: alive, a run worker's command
line, and started no later than that event, so a pid the system reused is never killed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

PID_EVENT = re.compile(r"Started process for run \(pid: (\d+)\)")
RUN_WORKER_MARKS = ("multiprocessing.spawn", "multiprocessing-fork", "dagster api execute_run")
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
    """The pid the run's worker announced in the run's log, and when; None before it started."""
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        match = PID_EVENT.search(record.message or "")
        if match:
            return int(match.group(1)), record.timestamp
    return None


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
    foreign_execute_run = "dagster api execute_run" in command and run_id not in command
    if not any(mark in command for mark in RUN_WORKER_MARKS) or foreign_execute_run:
        raise RunWorkerNotFound(f"pid {pid} of run {run_id} now belongs to another process ({command[:80]}); "
                                "not killing it")
    began = started_at(pid)
    if began is not None and began > announced + CLOCK_SLACK:
        raise RunWorkerNotFound(f"pid {pid} of run {run_id} was reused by a process started after the run "
                                "worker; not killing it")
    return RunWorker(pid, command, announced)
