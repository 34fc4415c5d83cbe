"""The heartbeat watchdog of seed 004: crash detection separate from the hard deadline.

A daemon thread pulses every ``interval`` while a node runs. It dies with its process, so
``kill -9`` stops the heartbeats and the pipeline becomes an orphan once
``heartbeat_deadline = last pulse + timeout`` passes. Transient database errors are
logged and retried; they never kill the work. After a gap longer than ``timeout`` the
watchdog re-checks ownership before it claims liveness again, and a lost ownership
stops the node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .classify import classify
from .env import check_seconds, env_seconds
from .errors import ConfigurationError, OwnershipLost, StopRequested
from .models import Ownership
from .redaction import redact

log = logging.getLogger("recovery_ext.heartbeat")

DEFAULT_INTERVAL = 30.0
DEFAULT_TIMEOUT = 90.0


@dataclass(frozen=True)
class HeartbeatSettings:
    """Per-node liveness settings; validated when built (seed 004: interval <= timeout / 2)."""

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
    def from_env(cls, prefix: str = "RECOVERY_HEARTBEAT_") -> "HeartbeatSettings":
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

    def start(self) -> "Watchdog":
        self._last_ok = self.clock()
        self._thread = threading.Thread(target=self._run, name=f"rx-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc_info) -> None:
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


def store_pulse(store, own: Ownership, node_name: str | None, timeout: float) -> Callable[[], None]:
    """A pulse that extends one node's and its pipeline's heartbeat, fenced by ``own``."""

    def pulse() -> None:
        if store.heartbeat([(own, node_name)], timeout):
            current = store.get_pipeline(own.pipeline_id)
            raise OwnershipLost(owner=current.owner or f"(pipeline {current.status})", pipeline_id=own.pipeline_id)

    return pulse
