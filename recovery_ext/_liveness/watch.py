"""The process that knows: a watcher vouches for the step processes it started, or reports them dead.

A run worker is the parent of its multiprocess step processes; a Celery worker's main process is
the parent of its pool processes. Each step records on its node which process it is and which
process watches it (:mod:`recovery_ext._processes`). :class:`ProcessWatch` reads the
running nodes this process watches, looks each step process up in the kernel and writes the
verdict back: a live process's node is vouched for (it is not an orphan even when its own
heartbeat is late, only slow), a dead one's node is reported dead at once, so the orphan sensor
reclaims it at its next tick instead of after the heartbeat timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from recovery_ext._classify.redaction import redact
from recovery_ext._processes import become_watcher, is_alive, this_process
from recovery_ext._store.interfaces import LivenessStore
from recovery_ext._store.models import WatchedNode

log = logging.getLogger("recovery_ext._liveness.watch")


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
