"""The liveness of this process's work: its heartbeats, and the processes it watches.

Heartbeats are crash detection separate from the hard deadline.

:class:`HeartbeatRegistry` is the process-wide pulse: one daemon thread per store that
extends, in ONE transaction per interval, everything the process keeps alive (the run
worker registers its pipeline, step processes register the nodes they run; in-process
both share it). :class:`Watchdog` is the single-pulse thread used for queue items.

A daemon thread pulses every ``interval`` while a node runs. It dies with its process, so
``kill -9`` stops the heartbeats and the pipeline becomes an orphan once
``heartbeat_deadline = last pulse + timeout`` passes. Transient database errors are
logged and retried; they never kill the work. After a gap longer than ``timeout`` the
watchdog re-checks ownership before it claims liveness again, and a lost ownership
stops the node.

The watch (:class:`ProcessWatch`, :class:`HostWatch`, :func:`watch_run_worker`) is the process that knows: a
watcher vouches for the step processes it started, or reports them dead. :class:`ProcessWatch` runs on the
heartbeat's pulse; :class:`HostWatch` and :func:`watch_run_worker` on threads of their own.

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
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from recovery_ext._classify.classifier import classify
from recovery_ext._settings import check_seconds, env_seconds
from recovery_ext._errors import ConfigurationError, OwnershipLost, StopRequested
from recovery_ext._store.models import Ownership, WatchedNode
from recovery_ext._classify.redaction import redact
from recovery_ext._processes import become_watcher, is_alive, this_process
from recovery_ext._store.interfaces import LivenessStore

log = logging.getLogger("recovery_ext._liveness.heartbeat")
# The log channels of the watch, named as they were when it was a module of its own (a deployment may filter on them).
watch_log = logging.getLogger("recovery_ext._liveness.watch")
parent_log = logging.getLogger("recovery_ext._liveness.parent")

DEFAULT_INTERVAL = 30.0
DEFAULT_TIMEOUT = 90.0


@dataclass(frozen=True)
class HeartbeatSettings:
    """Per-node liveness settings; validated when built (interval <= timeout / 2, so one lost pulse is not a death)."""

    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT
    stall_timeout: float | None = None

    allow_long: bool = False

    def __post_init__(self) -> None:
        # NaN, infinities and absurd values: an interval of 1e-9 s writes thousands of times a second.
        check_seconds("heartbeat interval", self.interval, allow_long=self.allow_long)
        check_seconds("heartbeat timeout", self.timeout, minimum=0.2, allow_long=self.allow_long)
        check_seconds("stall_timeout", self.stall_timeout, minimum=1.0, allow_none=True, allow_long=self.allow_long)
        if self.interval > self.timeout / 2:
            raise ConfigurationError(
                f"heartbeat interval ({self.interval} s) must be at most half the timeout ({self.timeout} s), "
                "so one lost pulse never makes a live worker look dead"
            )

    @classmethod
    def from_env(cls, prefix: str = "RECOVERY_HEARTBEAT_") -> HeartbeatSettings:
        return cls(interval=env_seconds(prefix + "INTERVAL", DEFAULT_INTERVAL),
                   timeout=env_seconds(prefix + "TIMEOUT", DEFAULT_TIMEOUT),
                   stall_timeout=env_seconds(prefix + "STALL_TIMEOUT", None))


class Watchdog:
    """Pulses ``pulse()`` every ``settings.interval`` seconds on a daemon thread."""

    def __init__(
        self,
        pulse: Callable[[], None],
        settings: HeartbeatSettings,
        *,
        verify: Callable[[], None] | None = None,
        name: str = "watchdog",
        on_lost: Callable[[OwnershipLost], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pulse = pulse
        self.verify = verify
        self.settings = settings
        self.name = name
        self.on_lost = on_lost
        self.clock = clock
        self.lost: OwnershipLost | None = None
        self.pulses = 0
        self.failures = 0
        self.stopping = threading.Event()
        self.superseded = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = clock()

    def start(self) -> Watchdog:
        self._last_ok = self.clock()
        self._thread = threading.Thread(target=self._run, name=f"rx-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self) -> None:
        """Raise in the worker if ownership was lost or the node is being stopped."""
        if self.lost is not None:
            raise self.lost
        if self.stopping.is_set():
            raise StopRequested()

    def _run(self) -> None:
        wait = self.settings.interval
        while not self.stopping.wait(wait):
            gap = self.clock() - self._last_ok
            try:
                if gap > self.settings.timeout and self.verify is not None:
                    self.verify()
                self.pulse()
            except OwnershipLost as exc:
                self.lost = exc
                self.superseded.set()
                log.warning("%s: %s; stopping the node", self.name, exc)
                if self.on_lost is not None:
                    self.on_lost(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a pulse failure must never kill the work
                self.failures += 1
                found = classify(exc)
                level = logging.ERROR if gap > self.settings.timeout or not found.retryable else logging.WARNING
                log.log(level, "%s: heartbeat failed (%s, %s) %.1f s after the last pulse: %s", self.name,
                        found.category, "retrying" if found.retryable else "will keep trying", gap, redact(exc))
                wait = min(self.settings.interval, max(0.05, self.settings.interval / 4))
                continue
            if gap > self.settings.timeout:
                log.warning("%s: heartbeat resumed after %.1f s without one; ownership re-checked", self.name, gap)
            self._last_ok = self.clock()
            self.pulses += 1
            wait = self.settings.interval


def store_pulse(store: LivenessStore, own: Ownership, node_name: str | None, timeout: float) -> Callable[[], None]:
    """A pulse that extends one node's and its pipeline's heartbeat, fenced by ``own``."""

    def pulse() -> None:
        if store.pipelines.heartbeat([(own, node_name)], timeout):
            current = store.pipelines.get_pipeline(own.pipeline_id)
            raise OwnershipLost(owner=current.owner or f"(pipeline {current.status})", pipeline_id=own.pipeline_id)

    return pulse


class Lease:
    """One thing a process keeps alive: a pipeline (``node`` None) or a running node of it.

    ``check()`` raises in the worker once the pulse found the ownership lost (or the lease
    was released), so a superseded worker stops at its next check.
    """

    def __init__(self, registry: HeartbeatRegistry, own: Ownership, node: str | None,
                 settings: HeartbeatSettings) -> None:
        self.registry = registry
        self.own = own
        self.node = node
        self.settings = settings
        self.lost: OwnershipLost | None = None
        self.superseded = threading.Event()
        self.stopping = threading.Event()

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self.stopping.is_set():
            raise StopRequested()

    def release(self) -> None:
        self.stopping.set()
        self.registry.release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _lose(self, exc: OwnershipLost) -> None:
        self.lost = exc
        self.superseded.set()


class HeartbeatRegistry:
    """A process's single heartbeat thread for one store: one transaction per tick for every lease.

    The tick is the smallest interval among the leases. A failing pulse is logged and retried
    sooner; it never stops the work. A lost ownership marks that pipeline's leases lost.
    """

    def __init__(self, store: LivenessStore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._leases: list[Lease] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick: float | None = None  # the interval the thread is waiting out (under _lock)
        self._last_ok = clock()
        self.pulses = 0
        self.failures = 0
        self.watch: ProcessWatch | None = None

    def watch_processes(self) -> ProcessWatch:
        """This process starts step processes (a run worker): from now on every pulse also vouches for
        the live ones and reports the dead ones (:class:`ProcessWatch`)."""
        with self._lock:
            if self.watch is None:
                self.watch = ProcessWatch(self.store, become_watcher())
            return self.watch

    def register(self, own: Ownership, settings: HeartbeatSettings, node: str | None = None) -> Lease:
        lease = Lease(self, own, node, settings)
        with self._lock:
            self._leases.append(lease)
            if self._thread is None or not self._thread.is_alive():
                self._last_ok = self.clock()
                self._tick = None
                self._thread = threading.Thread(target=self._run, name="rx-heartbeat", daemon=True)
                self._thread.start()
                return lease
            # Wake the thread only when its tick must shorten. Every node registers and releases a
            # lease, and waking a thread twice per node cost scheduling waits on a busy machine.
            wake = self._tick is None or settings.interval < self._tick
        if wake:
            self._wake.set()
        return lease

    def release(self, lease: Lease) -> None:
        with self._lock:
            if lease in self._leases:
                self._leases.remove(lease)
            last = not self._leases
        if last:  # the thread ends now instead of at its next tick; a longer tick can wait till then
            self._wake.set()

    @property
    def leases(self) -> list[Lease]:
        with self._lock:
            return list(self._leases)

    def _interval(self, leases: list[Lease]) -> float:
        return min(lease.settings.interval for lease in leases)

    def _run(self) -> None:
        retry_at: float | None = None
        while True:
            with self._lock:
                leases = list(self._leases)
                if not leases:
                    self._thread = None
                    self._tick = None
                    return
                self._wake.clear()
                self._tick = tick = self._interval(leases)
            due = retry_at if retry_at is not None else self._last_ok + tick
            delay = due - self.clock()
            if delay > 0:
                self._wake.wait(delay)  # woken early when leases change: the tick is recomputed
                continue
            wait = self.pulse_once(leases)
            retry_at = None if wait >= tick else self.clock() + wait

    def pulse_once(self, leases: list[Lease] | None = None) -> float:
        """Pulse every lease in one transaction; returns how long to wait before the next pulse."""
        from recovery_ext._store.models import NodeBeat, PipelineBeat

        leases = self.leases if leases is None else leases
        live = [lease for lease in leases if lease.lost is None]
        if not live:
            return self._interval(leases) if leases else 0.0
        interval = self._interval(live)
        timeout = min(lease.settings.timeout for lease in live)
        gap = self.clock() - self._last_ok
        try:
            lost = self.store.pipelines.pulse(
                [PipelineBeat(lease.own, lease.settings.timeout) for lease in live if lease.node is None],
                [NodeBeat(lease.own, lease.node, lease.settings.timeout) for lease in live if lease.node is not None],
            )
        except Exception as exc:  # noqa: BLE001 - a pulse failure must never kill the work
            self.failures += 1
            found = classify(exc)
            level = logging.ERROR if gap > timeout or not found.retryable else logging.WARNING
            log.log(level, "heartbeat failed (%s, %s) %.1f s after the last pulse: %s", found.category,
                    "retrying" if found.retryable else "will keep trying", gap, redact(exc))
            return min(interval, max(0.05, interval / 4))
        if gap > timeout:
            log.warning("heartbeat resumed after %.1f s without one; every beat was fenced by its epoch", gap)
        self._last_ok = self.clock()
        self.pulses += 1
        if self.watch is not None and any(lease.node is None for lease in live):
            # only while this process heartbeats a run: its word lasts as long as its own pulse does
            self.watch.check_quietly(min(lease.settings.timeout for lease in live if lease.node is None))
        for pipeline_id in lost:
            try:
                current = self.store.pipelines.get_pipeline(pipeline_id)
                owner = current.owner or f"(pipeline {current.status})"
                ended = f"pipeline {current.status}" if current.owner else None
            except Exception:  # noqa: BLE001 - the message is best effort; the loss is not
                owner, ended, current = "(unknown)", None, None
            for lease in live:
                if lease.own.pipeline_id != pipeline_id:
                    continue
                if current is not None and current.owner == lease.own.owner and current.epoch == lease.own.epoch:
                    # still ours, but finished (its last node completed it): nothing left to keep alive
                    log.debug("pipeline %s is %s; its heartbeat stops", pipeline_id, current.status)
                    owner = f"{owner} ({ended})"
                else:
                    log.warning("pipeline %s: ownership lost to %s; stopping %s", pipeline_id, owner,
                                lease.node or "the run's heartbeat")
                lease._lose(OwnershipLost(owner=owner, pipeline_id=pipeline_id))
                self.release(lease)
        return interval


_registries: weakref.WeakKeyDictionary[object, HeartbeatRegistry] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def registry_for(store: LivenessStore) -> HeartbeatRegistry:
    """The process-wide heartbeat registry of ``store`` (one per store object, one store per URL)."""
    with _registries_lock:
        registry = _registries.get(store)
        if registry is None:
            registry = _registries[store] = HeartbeatRegistry(store)
        return registry


# -- the processes this process watches ---------------------------------------------------------------------------


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
                watch_log.warning("step process of node(s) %s died; reported dead for recovery", ", ".join(report.dead))
            return report

    def check_quietly(self, timeout: float) -> WatchReport | None:
        """:meth:`check`, logging instead of raising: a failed check only leaves the node heartbeat to decide."""
        try:
            return self.check(timeout)
        except Exception as exc:  # noqa: BLE001 - the work goes on; the next check tries again
            watch_log.warning("could not check the watched step processes: %s", redact(exc))
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
                    watch_log.warning("host watch: no store yet: %s", redact(exc))
                    continue
            self.watch.check_quietly(self.timeout)


# -- a step process watches its run worker --------------------------------------------------------------------------

# Set by the run worker for the processes it starts, so a step started through a fork server
# (whose parent is not the run worker) still watches the right process.
RUN_WORKER_PID_ENV = "RECOVERY_RUN_WORKER_PID"
DEFAULT_POLL = 0.1

RUN_WORKER_GONE = threading.Event()
_run_worker_watch: dict[str, threading.Thread] = {}
_run_worker_watch_lock = threading.Lock()


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
    with _run_worker_watch_lock:
        if "thread" in _run_worker_watch and _run_worker_watch["thread"].is_alive():
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
        _run_worker_watch["thread"] = thread
        thread.start()
    return RUN_WORKER_GONE
