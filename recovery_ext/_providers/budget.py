"""Waiting for a provider's request and token budget, shared by every process through the store.

:class:`ProviderLimits` (beside the store's budget table, which takes them whole) says how many
requests and tokens a provider allows per minute (per endpoint, or per model of it).
:class:`RateBudget` reserves one request and a call's estimated tokens before the call
(``store.providers.budget_reserve``, on the database clock) and waits while the window is full. The wait is a
visible state, not a failure: the pipeline shows ``waiting`` with a ``rate budget`` reason, its
heartbeats go on (the waiting thread is not the heartbeat thread), and a stop (superseded, run
worker gone, shutdown) ends the wait at once. The response's usage corrects the reservation
(:meth:`Reservation.settle`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from recovery_ext._classify.redaction import redact, redact_url
from recovery_ext._store.interfaces import GuardStore
from recovery_ext._errors import StopRequested
from recovery_ext._store.models import BudgetGrant, ProviderLimits
from recovery_ext._store.models import Ownership
from recovery_ext._providers.steps import Blocking, SharedWait, Sleep, Steps, drive

# A wait at least this long is shown on the pipeline (shorter ones would only add writes).
SHOW_AFTER = 0.25


class Reservation:
    """One granted request; :meth:`settle` replaces its estimated tokens with the response's usage."""

    def __init__(self, store: GuardStore, reservation_id: int) -> None:
        self.store, self.id = store, reservation_id
        self.settled: int | None = None

    def release(self) -> None:
        """Give the request back to the window: it was never sent."""
        self.store.providers.budget_release(self.id)

    def answered(self) -> None:
        """Its answer arrived (or it failed): its room is held one window from now, then given back."""
        self.store.providers.budget_answered(self.id)

    def settle(self, tokens: int, cost: float | None = None) -> None:
        total = tokens if self.settled is None else self.settled + tokens  # several recorded parts of one call
        self.store.providers.budget_settle(self.id, total)
        self.settled = total


class RateBudget:
    """The shared budget of one endpoint, as one caller uses it."""

    def __init__(self, store: GuardStore, endpoint: str, limits: ProviderLimits, *, who: str | None = None,
                 show_wait: Callable[[float, str], None] | None = None, end_wait: Callable[[], None] | None = None,
                 stop: threading.Event | None = None, check: Callable[[], None] | None = None,
                 log: Callable[[str], None] | None = None, own: Ownership | None = None) -> None:
        # the budget key names the endpoint without its credentials, as the breaker's does
        self.store, self.endpoint, self.limits = store, redact_url(endpoint), limits
        self.who, self.own = who, own
        self.show_wait, self.end_wait = show_wait, end_wait
        self.stop, self.check = stop, check
        self.log = log or (lambda message: None)
        self.waited = 0.0  # seconds this caller spent waiting for budget, all calls together
        # The calls of this caller waiting now: a node with 64 items in flight shows one wait, from its first
        # waiting call to its last, not one tag write and one event per call and window.
        self._waiters = SharedWait()

    def acquire(self, tokens: int, model: str | None = None) -> Reservation:
        """Wait until the window has room for one request of ``tokens``, then hold it."""
        return drive(self.acquire_steps(tokens, model))

    def acquire_steps(self, tokens: int, model: str | None = None) -> Steps[Reservation]:
        """:meth:`acquire` as steps, for a thread (:func:`drive`) or an event loop (:func:`drive_async`)."""
        limits = self.limits
        shown = False
        started = time.monotonic()
        try:
            while True:
                if self.check is not None:
                    self.check()
                grant = yield Blocking(self._reserve, (tokens, model))
                if grant.reservation is not None:  # granted: the id of the request it holds
                    return Reservation(self.store, grant.reservation)
                wait = grant.wait_seconds
                if not shown and wait >= SHOW_AFTER and self.show_wait is not None:
                    shown = True
                    if self._waiters.join():  # the first of this caller's calls to wait shows it
                        named = f"{redact(self.endpoint)}{f' model {model}' if limits.per_model and model else ''}"
                        if grant.backing_off:
                            reason = f"{named}: the provider refused for its rate limit, everybody sharing it backs off"
                        else:
                            reason = (f"{named}: {grant.requests_in_window} requests and {grant.tokens_in_window} "
                                      f"tokens in the last {limits.window_seconds:g} s")
                        self.log(f"waiting {wait:.1f} s for the rate budget of {reason}")
                        yield Blocking(self.show_wait, (wait, reason))
                yield Sleep(wait, self.stop, self.check, "stopped while waiting for the provider's rate budget")
        finally:
            self.waited += time.monotonic() - started
            if shown and self._waiters.leave() and self.end_wait is not None:  # the last one ends it
                yield Blocking(self.end_wait)


    def _reserve(self, tokens: int, model: str | None) -> BudgetGrant:
        return self.store.providers.budget_reserve(self.endpoint, model, tokens=max(0, int(tokens)),
                                                   limits=self.limits, holder=self.who, own=self.own)

    def back_off(self, model: str | None, retry_after: float | None, *, max_delay: float | None = None) -> None:
        """The provider refused for its rate (a 429): nobody sharing this budget, in any process, sends for a
        while (``retry_after`` when the provider said it), at most ``max_delay``: the caller's own cap on a
        Retry-After (its retry policy's), so a hostile one never closes the endpoint for longer. Never raises:
        the caller's own retry still waits."""
        try:
            self.store.providers.budget_back_off(self.endpoint, model, limits=self.limits, retry_after=retry_after,
                                                 max_delay=max_delay)
        except Exception as exc:  # noqa: BLE001 - the shared back-off is a courtesy to the others
            self.log(f"could not share a rate limit back-off: {redact(exc)}")


def sleep_or_stop(seconds: float, stop: threading.Event | None, check: Callable[[], None] | None, why: str) -> None:
    """Sleep, in slices short enough that a stop (raising :class:`StopRequested` with ``why``) or a ``check``
    ends the wait at once."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop.wait(min(left, 0.2)):
            raise StopRequested(why)
        if stop is None:
            time.sleep(min(left, 0.2))
        if check is not None:
            check()
