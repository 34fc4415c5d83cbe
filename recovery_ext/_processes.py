"""Which process runs a node, and whether it is alive, as the host it runs on knows it.

A node's own heartbeat can only say "I pulsed lately"; on an overloaded machine a live step
process can miss its deadline. The process that started it (its run worker, or the main
process of its Celery worker) knows better: it can look the process up in the kernel. A
process is named by a *process key*, ``host/pid/start``, where ``start`` is its start time in
clock ticks since boot (``/proc/<pid>/stat``), so a pid the kernel reuses for another process
never passes for the one that died.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

# Set by a watcher (a run worker, a Celery worker's main process) for the processes it starts:
# the key of the process that vouches for them. Inherited through fork, spawn and forkserver.
WATCHER_ENV = "RECOVERY_WATCHER"

_PROC = Path("/proc")
_HOST = socket.gethostname()
_DEAD_STATES = ("Z", "X", "x")  # zombie (killed, not yet reaped) or dead


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of ``pid`` from ``/proc``; None when there is no such process."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) is in parentheses and may itself hold spaces or parentheses
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], fields[19]


def process_key(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid) if _PROC.is_dir() else None
    return f"{_HOST}/{pid}/{stat[1] if stat else ''}"


def this_process() -> str:
    return process_key()


def watcher_of_this_process() -> str | None:
    """The key of the process that vouches for this one, if one said so."""
    return os.environ.get(WATCHER_ENV) or None


def become_watcher() -> str:
    """In a run worker or a Celery worker's main process: the processes started from now on name it."""
    key = this_process()
    os.environ[WATCHER_ENV] = key
    return key


def is_alive(key: str) -> bool | None:
    """Whether the process named by ``key`` is alive; None when this host cannot tell (another host)."""
    try:
        host, pid_text, start = key.rsplit("/", 2)
        pid = int(pid_text)
    except ValueError:
        return None
    if host != _HOST or pid <= 0:
        return None
    if not _PROC.is_dir():  # no /proc: the pid alone (a reused pid passes for alive, never for dead)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = _stat(pid)
    if stat is None or stat[0] in _DEAD_STATES:
        return False
    return not start or stat[1] == start
