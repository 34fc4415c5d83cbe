"""Recording provider calls without ever failing the work.

:class:`CallRecorder` (one per store and process) holds each recorded call in memory until it is
written. Almost every call is written by its item's checkpoint, in the checkpoint's own
transaction (no extra round trip); a call that no checkpoint takes within ``linger`` seconds (an
error, an item that failed, a node-level call still running, a worker that was superseded) is
written by a background thread. While the database is away the calls wait in memory and are
written by the next checkpoint that keeps them, or by the thread once the database is back.

:func:`record_provider_call` is the public way for any client to record a call: it finds the
node (and item) the call was made in through a context variable the node sets, and corrects the
budget reservation the provider guard holds for the call, if any.

:func:`observe` hands each call, once, to the telemetry switched on (OpenTelemetry, see
:mod:`recovery_ext._observe.otel`): a call a node records, from ``NodeContext.record_call`` (where
:func:`record_provider_call` arrives too), and a call made outside any node from here.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from recovery_ext._classify.redaction import redact
from recovery_ext._store.interfaces import GuardStore
from recovery_ext._store.models import ProviderCall

log = logging.getLogger("recovery_ext._providers.ledger")

DEFAULT_LINGER = 0.5
IDLE_SECONDS = 60.0  # the writer thread ends after this long with nothing to write
MAX_BUFFERED = 100_000  # past this many unwritten calls (a very long outage) the oldest are dropped, and logged


class CallScope(Protocol):
    """Where a call is recorded: a node (``NodeContext``) and the item it is working on."""

    def record_call(self, call: ProviderCall, *, item: Any = None) -> bool: ...


class Settlement(Protocol):
    def settle(self, tokens: int, cost: float | None = None) -> None: ...


# The node (and item) the current code runs in; set by the node around its body and its items.
current_scope: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("rx_call_scope", default=None)
# The budget reservation a provider guard holds for the attempt under way in this thread.
current_reservation: contextvars.ContextVar[Settlement | None] = contextvars.ContextVar("rx_reservation",
                                                                                        default=None)


# What each provider call is shown to besides the ledger (OpenTelemetry, once switched on); None: nothing,
# and a call pays one global read for it.
_observer: Callable[[ProviderCall], None] | None = None


def set_observer(observer: Callable[[ProviderCall], None] | None) -> None:
    global _observer
    _observer = observer


def observe(call: ProviderCall) -> None:
    """Show ``call`` to the observer, if any. Never raises: telemetry must not fail the work."""
    observer = _observer
    if observer is None:
        return
    try:
        observer(call)
    except Exception as exc:  # noqa: BLE001 - a broken exporter or SDK costs the telemetry, not the call
        log.warning("provider call telemetry failed: %s", redact(exc))


def record_provider_call(call: ProviderCall) -> bool:
    """Record ``call`` in the ledger of the node (and item) it was made in; returns whether there was one.

    Also corrects the budget reservation of the guarded attempt it answers (the response's usage
    replaces the estimate). Never raises: recording must not fail the work. Outside a recoverable
    node (or in a thread the node did not start) pass the call to ``ctx.record_call`` instead.
    """
    settle(call)
    scope = current_scope.get()
    if scope is None:
        log.debug("provider call outside a recoverable node: not recorded")
        observe(call)  # no ledger here, but the call was made: its span and metrics still count it
        return False
    return scope.record_call(call)


def settle(call: ProviderCall) -> None:
    reservation = current_reservation.get()
    if reservation is None:
        return
    try:
        reservation.settle(call.tokens, call.cost)
    except Exception as exc:  # noqa: BLE001 - the reservation stays at its estimate: safe, never a failure
        log.warning("could not correct a budget reservation: %s", redact(exc))


class CallRecorder:
    """Unwritten calls of one store in this process, and the thread that writes the ones no checkpoint took."""

    def __init__(self, store: GuardStore, *, linger: float = DEFAULT_LINGER) -> None:
        self.store = store
        self.linger = linger
        self._pending: dict[str, tuple[float, ProviderCall]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.dropped = 0

    def record(self, call: ProviderCall) -> None:
        with self._lock:
            if len(self._pending) >= MAX_BUFFERED:
                oldest = min(self._pending, key=lambda k: self._pending[k][0])
                del self._pending[oldest]
                self.dropped += 1
                log.error("provider ledger: %d calls could not be written; dropped the oldest", MAX_BUFFERED)
            self._pending[call.id] = (time.monotonic(), call)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rx-ledger", daemon=True)
                self._thread.start()

    def written(self, calls: Iterable[ProviderCall]) -> None:
        """A checkpoint committed these calls: nothing left to write."""
        with self._lock:
            for call in calls:
                self._pending.pop(call.id, None)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self, *, older_than: float = 0.0) -> bool:
        """Write the pending calls recorded at least ``older_than`` seconds ago; returns whether all of those
        were written (False: the database is away, they stay pending)."""
        now = time.monotonic()
        with self._lock:
            due = [call for at, call in self._pending.values() if now - at >= older_than]
        if not due:
            return True
        try:
            self.store.providers.record_provider_calls(due)
        except Exception as exc:  # noqa: BLE001 - recording never fails the work; the calls stay buffered
            self.failures += 1
            log.warning("provider ledger: %d call(s) not written yet, kept in memory: %s", len(due), redact(exc))
            return False
        self.written(due)
        return True

    def _run(self) -> None:
        """Every ``linger`` seconds, write the calls that waited that long; ends after a minute without any
        (a thread per call would cost more than the call's row: no wake-up per record)."""
        backoff = self.linger
        idle_since = time.monotonic()
        while True:
            time.sleep(backoff)
            with self._lock:
                if not self._pending:
                    if time.monotonic() - idle_since > IDLE_SECONDS:
                        self._thread = None
                        return
                    continue
            idle_since = time.monotonic()
            backoff = self.linger if self.flush(older_than=self.linger) else min(backoff * 2, 10.0)


_recorders: weakref.WeakKeyDictionary[object, CallRecorder] = weakref.WeakKeyDictionary()
_recorders_lock = threading.Lock()


def recorder_for(store: GuardStore) -> CallRecorder:
    """The process-wide call recorder of ``store``."""
    with _recorders_lock:
        recorder = _recorders.get(store)
        if recorder is None:
            recorder = _recorders[store] = CallRecorder(store)
        return recorder
