"""A step process notices at once that its run worker died.

A step process of the multiprocess executor is a child of its run worker. When the run worker is
killed, the step goes on: its own node heartbeat keeps it looking alive until the orphan sensor
reclaims the pipeline, seconds later, and every provider call it makes meanwhile is paid again
by the resume. :func:`watch_run_worker` starts one daemon thread per process that polls
``os.getppid()`` (a syscall, microseconds) every ``poll`` seconds: once the parent changes (the
process was re-parented, so the parent died), or the run worker's pid named in the environment
is gone, it sets :data:`RUN_WORKER_GONE`. Provider guards and ``ctx.items()`` refuse to start
new work from then on; the answer in flight may still be checkpointed (the epoch fence decides).
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("recovery_ext._liveness.parent")

# Set by the run worker for the processes it starts, so a step started through a fork server
# (whose parent is not the run worker) still watches the right process.
RUN_WORKER_PID_ENV = "RECOVERY_RUN_WORKER_PID"
DEFAULT_POLL = 0.1

RUN_WORKER_GONE = threading.Event()
_started: dict[str, threading.Thread] = {}
_lock = threading.Lock()


def mark_run_worker() -> None:
    """In the run worker: name this process as the one its step processes watch."""
    os.environ[RUN_WORKER_PID_ENV] = str(os.getpid())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def dead_run_worker() -> int | None:
    """In a step process, before its step begins: the pid of the run worker that started it if that process is
    gone already, else None. A step process can take seconds to start on a busy machine; its parent may be dead
    by then, and the watch below sees only a parent that changes while it watches."""
    named = os.environ.get(RUN_WORKER_PID_ENV, "")
    if named.isdigit() and int(named) != os.getpid() and not _alive(int(named)):
        return int(named)
    return None


def watch_run_worker(poll: float = DEFAULT_POLL) -> threading.Event:
    """In a step process: start watching the run worker (once per process); returns :data:`RUN_WORKER_GONE`."""
    with _lock:
        if "thread" in _started and _started["thread"].is_alive():
            return RUN_WORKER_GONE
        parent = os.getppid()
        named = os.environ.get(RUN_WORKER_PID_ENV, "")
        worker = int(named) if named.isdigit() and int(named) != os.getpid() else None

        def run() -> None:
            while not RUN_WORKER_GONE.is_set():
                if os.getppid() != parent or (worker is not None and not _alive(worker)):
                    log.warning("the run worker (pid %s) is gone: no new provider calls from this step process",
                                worker or parent)
                    RUN_WORKER_GONE.set()
                    return
                time.sleep(poll)

        thread = threading.Thread(target=run, name="rx-run-worker-watch", daemon=True)
        _started["thread"] = thread
        thread.start()
    return RUN_WORKER_GONE
