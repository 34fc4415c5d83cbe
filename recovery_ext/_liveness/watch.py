"""The process that knows: a watcher vouches for the step processes it started, or reports them dead.

A run worker is the parent of its multiprocess step processes; a Celery worker's main process is
the parent of its pool processes. Each step records on its node which process it is and which
process watches it (:mod:`recovery_ext._processes`). :class:`ProcessWatch` reads the
running nodes this process watches, looks each step process up in the kernel and writes the
verdict back: a live process's node is vouched for (it is not an orphan even when its own
heartbeat is late, only slow), a dead one's node is reported dead at once, so the orphan sensor
reclaims it at its next tick instead of after the heartbeat timeout.

The other way round, a step process notices at once that its run worker died. A step process of the
multiprocess executor is a child of its run worker. When the run worker is killed, the step goes on: its own
node heartbeat keeps it looking alive until the orphan sensor reclaims the pipeline, seconds later, and every
provider call it makes meanwhile is paid again by the resume. :func:`watch_run_worker` starts one daemon
thread per process that polls ``os.getppid()`` (a syscall, microseconds) every ``poll`` seconds: once the
parent changes (the process was re-parented, so the parent died), or the run worker's pid named in the
environment is gone, it sets :data:`RUN_WORKER_GONE`. Provider guards and ``ctx.items()`` refuse to start new
work from then on; the answer in flight may still be checkpointed (the epoch fence decides).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from recovery_ext._classify.redaction import redact
from recovery_ext._processes import become_watcher, is_alive, this_process
from recovery_ext._store.interfaces import LivenessStore
from recovery_ext._store.models import WatchedNode

log = logging.getLogger("recovery_ext._liveness.watch")
parent_log = logging.getLogger("recovery_ext._liveness.parent")


@dataclass
class WatchReport:
    alive: list[str] = field(default_factory=list)   # node names, as "pipeline/node"
    dead: list[str] = field(default_factory=list)


class ProcessWatch:
    """Checks the step processes this process watches; one read and at most one write per check."""

    def __init__(self, store: LivenessStore, key: str | None = None) -> None:
        self.store = store
        self.key = key or this_process()
        self._lock = threading.Lock()  # the pulse thread and a crash seen by the executor may both check

    def check(self, timeout: float) -> WatchReport:
        """Vouch for the live ones for ``timeout`` seconds; report the dead ones dead now."""
        with self._lock:
            report = WatchReport()
            alive: list[WatchedNode] = []
            dead: list[WatchedNode] = []
            for node in self.store.pipelines.watched_nodes(self.key):
                verdict = is_alive(node.process)
                if verdict is None:  # another host's process: not ours to judge
                    continue
                (alive if verdict else dead).append(node)
            if alive or dead:
                self.store.pipelines.vouch_nodes(self.key, alive, dead, timeout)
            report.alive = [f"{n.pipeline_id}/{n.name}" for n in alive]
            report.dead = [f"{n.pipeline_id}/{n.name}" for n in dead]
            if dead:
                log.warning("step process of node(s) %s died; reported dead for recovery", ", ".join(report.dead))
            return report

    def check_quietly(self, timeout: float) -> WatchReport | None:
        """:meth:`check`, logging instead of raising: a failed check only leaves the node heartbeat to decide."""
        try:
            return self.check(timeout)
        except Exception as exc:  # noqa: BLE001 - the work goes on; the next check tries again
            log.warning("could not check the watched step processes: %s", redact(exc))
            return None


class HostWatch:
    """A Celery worker's main process: names itself the watcher of its pool processes and checks them
    every ``interval`` seconds on a daemon thread, vouching for ``timeout`` seconds."""

    def __init__(self, store_factory: Callable[[], LivenessStore], *, interval: float, timeout: float) -> None:
        self.key = become_watcher()
        self.store_factory = store_factory
        self.interval = interval
        self.timeout = timeout
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.watch: ProcessWatch | None = None

    def start(self) -> HostWatch:
        self._thread = threading.Thread(target=self._run, name="rx-host-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            if self.watch is None:
                try:
                    self.watch = ProcessWatch(self.store_factory(), self.key)
                except Exception as exc:  # noqa: BLE001 - the store may not be reachable yet
                    log.warning("host watch: no store yet: %s", redact(exc))
                    continue
            self.watch.check_quietly(self.timeout)


# -- a step process watches its run worker --------------------------------------------------------------------------

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
                    parent_log.warning("the run worker (pid %s) is gone: no new provider calls from this step process",
                                worker or parent)
                    RUN_WORKER_GONE.set()
                    return
                time.sleep(poll)

        thread = threading.Thread(target=run, name="rx-run-worker-watch", daemon=True)
        _started["thread"] = thread
        thread.start()
    return RUN_WORKER_GONE
