"""Holding a pipeline to its spend caps: reserve before each request and job submission, pause at the cap.

:class:`SpendCap` reserves a call's estimate (tokens, and its most possible cost under the price table)
against the pipeline's caps (``store.providers.spend_reserve``: one conditional UPDATE per cap, fenced by
the epoch). At the cap it does not fail: the pipeline shows ``waiting`` with the reason ``spend cap: ...``,
its heartbeat goes on, and it looks again every ``poll_seconds`` until an operator raises the cap
(``recovery-ext spend-cap set``) or a stop ends the wait. :class:`SpendReservation` is what the call then
holds: the answer's usage settles it (:func:`record_provider_call` does, through the guard).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from recovery_ext._providers.steps import Blocking, SharedWait, Sleep, Steps, drive
from recovery_ext._store.interfaces import GuardStore
from recovery_ext._store.models import Ownership
from recovery_ext._store.models import SpendCaps


class SpendReservation:
    """One call's (or job's) room under its caps, until its usage settles it."""

    def __init__(self, store: GuardStore, ids: tuple[int, ...], scopes: list[str], tokens: int, cost: float) -> None:
        self.store, self.ids, self.scopes = store, ids, scopes
        self.tokens, self.cost = tokens, cost
        self.settled = False

    def settle(self, tokens: int, cost: float | None = None) -> None:
        """The call's usage (a call recorded in several parts adds each part)."""
        if self.settled:
            self.store.providers.spend_add(self.scopes, tokens=tokens, cost=cost)
        else:
            self.store.providers.spend_settle(self.ids, tokens=tokens, cost=cost)
            self.settled = True

    def settle_estimate(self) -> None:
        """The call was made and no usage was recorded for it: it counts at its estimate (it may have been charged)."""
        if not self.settled:
            self.settle(self.tokens, self.cost)

    def release(self) -> None:
        """No request was made: its room comes back."""
        if not self.settled:
            self.store.providers.spend_release(self.ids)
            self.settled = True


class SpendCap:
    """The caps of one node's pipeline, as that node's calls use them."""

    def __init__(self, store: GuardStore, own: Ownership, caps: SpendCaps, *, prices: Any = None,
                 show_wait: Callable[[float, str, bool], None] | None = None,
                 end_wait: Callable[[], None] | None = None,
                 stop: threading.Event | None = None, check: Callable[[], None] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.store, self.own, self.caps, self.prices = store, own, caps, prices
        self.show_wait, self.end_wait = show_wait, end_wait
        self.stop, self.check = stop, check
        self.log = log or (lambda message: None)
        self._scopes: list[str] | None = None
        self.waited = 0.0
        # The calls of this node waiting at the cap now: tens of tasks in flight show one pause, from the first
        # one's wait to the last one's, with one log line and one event, not one each.
        self._waiters = SharedWait()

    def _configure(self) -> list[str]:
        """The caps this node's calls reserve under, made or brought up to date at its first call. Without a cap
        in the configuration, one read says whether an operator set one on the pipeline or its deployment
        (``recovery-ext spend-cap set``). A step of the call, so on an event loop it runs in a worker thread."""
        if not self.caps.enabled and not self.store.providers.spend_caps_over(self.own.pipeline_id):
            return []
        return list(self.store.providers.spend_configure(self.own, self.caps))

    def cost_of(self, tokens: int, model: str | None) -> float:
        """The most ``tokens`` of ``model`` can cost (every token at the dearer of its two prices); 0 unpriced."""
        if self.prices is None:
            return 0.0
        most = self.prices.most(model, tokens)
        return 0.0 if most is None else most

    def acquire(self, tokens: int, model: str | None = None, *, cost: float | None = None,
                ref: str | None = None) -> SpendReservation | None:
        """Reserve ``tokens`` (and ``cost``, default: their most under the price table), waiting at the cap until
        it is raised; None: no cap holds the pipeline. ``ref``: the job whose results settle this reservation."""
        return drive(self.acquire_steps(tokens, model, cost=cost, ref=ref))

    def acquire_steps(self, tokens: int, model: str | None = None, *, cost: float | None = None,
                      ref: str | None = None) -> Steps[SpendReservation | None]:
        """:meth:`acquire` as steps, for a thread (:func:`drive`) or an event loop (:func:`drive_async`). On an
        event loop a wait at the cap holds no worker thread: the tasks that hold room go on, and their answers
        settle it (32 tasks of an ``amap`` waiting in the loop's 6 worker threads left none to those, and the
        node waited for ever)."""
        if self._scopes is None:
            self._scopes = yield Blocking(self._configure)
        scopes = self._scopes
        if not scopes:  # no cap holds the pipeline: nothing to reserve
            return None
        tokens = max(0, int(tokens))
        cost = self.cost_of(tokens, model) if cost is None else cost
        reserve = functools.partial(self.store.providers.spend_reserve, self.own, scopes, tokens=tokens, cost=cost,
                                    ref=ref)
        looks = 0
        started = time.monotonic()
        try:
            while True:
                if self.check is not None:
                    self.check()
                grant = yield Blocking(reserve)
                if grant.granted:
                    return SpendReservation(self.store, grant.reservations, scopes, tokens, cost)
                assert grant.full is not None
                reason = grant.full.describe(tokens, cost)
                # each waiting call joins the wait at its first look; the first of them shows and logs it
                first = looks == 0 and self._waiters.join()
                looks += 1
                if first:
                    self.log(f"paused at the spend cap: {reason}")
                if self.show_wait is not None:
                    # the next look is shown a poll from now, on the database clock; refreshed at every look
                    yield Blocking(self.show_wait, (self.caps.poll_seconds, reason, first))
                yield Sleep(self.caps.poll_seconds, self.stop, self.check, "stopped while paused at the spend cap")
        finally:
            self.waited += time.monotonic() - started
            if looks and self._waiters.leave() and self.end_wait is not None:  # the last one to wait ends it
                yield Blocking(self.end_wait)

