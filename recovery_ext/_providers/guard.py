"""Provider outages delay a pipeline, they do not kill it.

:class:`ProviderGuard` wraps each call to a provider (an LLM request, an OCR request) in one
tenacity ``Retrying``:

* **transient errors are retried**: jittered exponential backoff, or exactly the ``Retry-After``
  a 429/503 asked for (within the policy's maximum delay);
* **N errors of one category in a row** (escalation) no longer fail the call: they
  **pause the pipeline** for a jittered exponential cool-down. The pipeline shows as ``waiting``
  with the reason and the time of its next try, and the run sleeps while its watchdog keeps
  heartbeating, so a run that dies during the pause is still an orphan;
* **a circuit breaker per endpoint**, shared by every pipeline through the store: after N
  consecutive transient failures across pipelines the endpoint is open, callers wait instead of
  calling, and one half-open probe closes it again;
* **only permanent errors fail at once**; an outage longer than the **outage budget** gives up
  with :class:`OutageBudgetExceeded`.

Everything here is plain Python over the store; :mod:`recovery_ext._dagster.providers` binds
it to a node.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, cast, overload

import tenacity
from tenacity import RetryCallState
from tenacity.stop import stop_base

from recovery_ext._classify.classifier import ClassifiedError, classify, retry_after_of
from recovery_ext._classify.verdict import Classification
from recovery_ext._errors import ConfigurationError, StopRequested, StoreError, in_chain
from recovery_ext._store.models import Ownership
from recovery_ext._store.models import BreakerDecision
from recovery_ext._providers.budget import RateBudget, Reservation
from recovery_ext._providers.spend import SpendCap, SpendReservation
from recovery_ext._providers.journal import MISS, CallJournal, PendingCall, function_fingerprint
from recovery_ext._providers.ledger import current_reservation
from recovery_ext._providers.steps import checked_sleep
from recovery_ext._classify.redaction import redact, redact_url
from recovery_ext._classify.retry import (RetryPolicy, event_sleep, retry_if_retryable, stop_on_event,
                                          wait_jittered_exponential)
from recovery_ext._store.statuses import BreakerState
from recovery_ext._store.interfaces import GuardStore

T = TypeVar("T")
TRUSTED_CLOSED = BreakerDecision(True, BreakerState.CLOSED)  # what a recent read of a closed breaker said


@dataclass(frozen=True)
class OutageSettings:
    """How long outages may delay a pipeline, and when an endpoint's breaker opens."""

    pause_after: int = 5               # same-category transient errors in a row before the pipeline pauses
    pause_initial: float = 30.0        # first pause; doubles per pause
    pause_max: float = 300.0           # longest single pause
    budget_seconds: float = 7200.0     # an outage longer than this gives up (default 2 h)
    jitter: float = 0.1
    breaker_threshold: int = 5         # consecutive transient failures, across pipelines, that open the breaker
    breaker_cooldown: float = 30.0     # first open period; doubles each time the probe fails
    breaker_max_cooldown: float = 120.0  # short: the next probe may be this far away when the provider is back
    probe_timeout: float = 120.0       # a probe that neither succeeds nor fails by then is replaced
    # A closed breaker with no failures, once read, is trusted this long by the same guard (0: read
    # before every call). Another process's opening is seen this much later at most; any failure
    # here drops the trust at once. One read per call was a round trip per LLM request.
    breaker_refresh: float = 1.0

    def __post_init__(self) -> None:
        if self.pause_after < 1 or self.breaker_threshold < 1:
            raise ConfigurationError("pause_after and breaker_threshold must be at least 1")
        for name in ("pause_initial", "pause_max", "budget_seconds", "breaker_cooldown", "breaker_max_cooldown",
                     "probe_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"outage setting {name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.breaker_refresh <= 60.0:  # NaN fails this too
            raise ConfigurationError(f"breaker_refresh must be between 0 and 60 seconds, got {self.breaker_refresh}")
        if self.pause_initial > self.pause_max or self.breaker_cooldown > self.breaker_max_cooldown:
            raise ConfigurationError("an outage pause or breaker cool-down starts above its maximum")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError(f"jitter must be between 0 and 1, got {self.jitter}")


class CircuitOpen(ClassifiedError):
    """The endpoint's breaker is open: the call was not made; wait ``retry_after`` seconds."""

    def __init__(self, endpoint: str, seconds: float, state: str) -> None:
        what = "a half-open probe is under way" if state == BreakerState.HALF_OPEN else "its circuit breaker is open"
        super().__init__(category="circuit_open", retryable=True, endpoint=endpoint, retry_after=seconds,
                         message=f"not calling {redact(endpoint)}: {what}; next try in {seconds:.1f} s")


class OutageBudgetExceeded(ClassifiedError):
    """The provider stayed down longer than the outage budget: the call gives up, permanently."""


class PauseTarget(Protocol):
    """Where a pause is shown: the pipeline row (see :class:`StorePause`)."""

    paused: bool  # a pause is shown now: begun, and no retry nor answer has ended it since

    def begin(self, seconds: float, reason: str) -> None: ...

    def retrying(self) -> None: ...

    def end(self, *, outage_over: bool) -> None: ...

    def elapsed(self) -> float | None: ...


class StorePause:
    """Shows the pause on the pipeline (``waiting``, reason, next try) through fenced writes."""

    def __init__(self, store: GuardStore, own: Ownership, node: str | None = None) -> None:
        self.store, self.own, self.node = store, own, node
        self.waiting = False  # this node started an outage on the pipeline that is not over
        self.paused = False   # ... and is sleeping through a pause right now
        self.until: Any = None  # the next try of the current pause, on the database clock

    def begin(self, seconds: float, reason: str) -> None:
        self.until = self.store.providers.set_waiting(self.own, seconds, reason, node=self.node)
        self.waiting = True
        self.paused = True

    def retrying(self) -> None:
        """The pause is over and the provider is asked again: running, but the outage clock keeps going."""
        if self.paused:
            self.store.providers.clear_waiting(self.own, node=self.node, keep_outage_clock=True, event="outage_retry")
            self.paused = False

    def end(self, *, outage_over: bool) -> None:
        if self.waiting:
            keep = not outage_over or self.answer_keeps_clock()
            self.store.providers.clear_waiting(self.own, node=self.node, keep_outage_clock=keep,
                                               event=None if outage_over else "outage_budget_spent")
            self.waiting = self.paused = False

    def answer_keeps_clock(self) -> bool:
        """Whether an answer ending this pause leaves the outage clock running (a node's retry without progress
        yet: see ``RunVisiblePause``); here it never does."""
        return False

    def elapsed(self) -> float | None:
        return self.store.providers.waiting_seconds(self.own.pipeline_id)


class retry_provider_failures(retry_if_retryable):  # noqa: N801 - named as tenacity's strategies are
    """What the provider's trouble makes worth another attempt. A store error in the chain (the recovery database
    gone past the store's own retries, say as an answer was being kept) is not: the store retried already, and
    sending the request again would pay once more for an answer that could not be kept either. It goes to the
    node, which leaves the pipeline to recovery."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        failed = outcome.exception() if outcome is not None and outcome.failed else None
        if failed is not None and in_chain(failed, StoreError) is not None:
            return False
        return super().__call__(retry_state)


@dataclass
class GuardedCall:
    """The state of one guarded call across its attempts."""

    first_failure: float | None = None
    streak: tuple[str | None, int] = (None, 0)
    pauses: int = 0
    pause_reason: str | None = None
    estimated_tokens: int = 0
    model: str | None = None
    pending: PendingCall | None = None  # the call's journal entry (None: not journaled)
    pausing: bool = False  # sleeping through a pause now (counted in its guard's ``_pausers``)
    stopped: bool = False  # stopped or cancelled: never counted again (a cancelled task's thread may still pause)


class AttemptHold:
    """What one attempt holds: its room in the rate budget and under the spend caps. The answer's usage
    (:func:`record_provider_call`) settles both; an answer without usage, or a timeout (the provider may have
    charged it), counts at its estimate; any other error gives the cap its room back (nothing was charged)."""

    def __init__(self, rate: Reservation | None, spend: SpendReservation | None,
                 log: Callable[[str], None]) -> None:
        self.rate, self.spend, self.log = rate, spend, log

    @property
    def holds(self) -> bool:
        return self.rate is not None or self.spend is not None

    def settle(self, tokens: int, cost: float | None = None) -> None:
        if self.rate is not None:
            self.rate.settle(tokens)
        if self.spend is not None:
            self.spend.settle(tokens, cost)

    def release(self) -> None:
        if self.rate is not None:
            self.rate.release()
        if self.spend is not None:
            self.spend.release()

    def answered_without_usage(self) -> None:
        self._safely(lambda spend: spend.settle_estimate())

    def spent_unknown(self, exc: BaseException) -> None:
        # an unreadable 2xx answer (UnreadableAnswer.charged) was probably billed, as a timeout may have been
        charged = not isinstance(exc, Exception) or getattr(exc, "charged", False) is True \
            or classify(exc).category == "timeout"
        self._safely(lambda spend: spend.settle_estimate() if charged else spend.release())

    def _safely(self, action: Callable[[SpendReservation], None]) -> None:
        """Never masks the call's own result or error; a failed write leaves the reservation counted (safe)."""
        if self.spend is None:
            return
        try:
            action(self.spend)
        except Exception as exc:  # noqa: BLE001
            self.log(f"could not settle a spend cap reservation (it stays counted): {redact(exc)}")


@overload
def cut_to_budget(delay: float, spent: float, budget: float, reason: str) -> tuple[float, str]: ...
@overload
def cut_to_budget(delay: float, spent: float, budget: float, reason: None) -> tuple[float, None]: ...
@overload
def cut_to_budget(delay: float, spent: float, budget: float, reason: str | None) -> tuple[float, str | None]: ...
def cut_to_budget(delay: float, spent: float, budget: float, reason: str | None) -> tuple[float, str | None]:
    """``delay`` cut to what is left of the outage budget once ``spent`` seconds of it are gone, and the reason
    shown for it, which says so when it is cut. No wait runs past the budget (a breaker's cool-down of 30 s under
    a budget of 5 s gave up at 30 s): the call, or the node, tries once more, and gives up if that fails too."""
    left = max(0.0, budget - spent)
    if left >= delay:
        return delay, reason
    return left, None if reason is None else f"{reason} (waiting only the {left:.1f} s left of the outage budget)"


def _failure(retry_state: RetryCallState) -> BaseException:
    """The error tenacity waits after or gives up on: retry_if_retryable retries failed attempts only."""
    exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
    assert exc is not None
    return exc


class ProviderGuard:
    """Calls a provider through the breaker, the retry policy and the outage pause; see the module doc."""

    def __init__(self, endpoint: str, *, policy: RetryPolicy | None = None, settings: OutageSettings | None = None,
                 store: GuardStore | None = None, pause: PauseTarget | None = None, who: str | None = None,
                 sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None,
                 shutdown: threading.Event | None = None, rng: random.Random | None = None,
                 log: Callable[[str], None] | None = None, budget: RateBudget | None = None,
                 check: Callable[[], None] | None = None, journal: CallJournal | None = None,
                 spend: SpendCap | None = None) -> None:
        # the breaker key and every message name the endpoint without its credentials
        self.endpoint = redact_url(endpoint)
        self.policy = policy or RetryPolicy()
        self.settings = settings or OutageSettings()
        self.store, self.pause = store, pause
        self.who = who or f"{uuid.uuid4().hex[:12]}"
        self.shutdown = shutdown
        # a retry pause ends at once on a shutdown, and within a slice once ``check`` says no call may leave
        self.sleep = sleep or (checked_sleep(shutdown, check) if check is not None
                               else event_sleep(shutdown) if shutdown is not None else time.sleep)
        self.clock = clock or time.monotonic
        self.log = log or (lambda message: None)
        s = self.settings
        self.pause_wait = wait_jittered_exponential(s.pause_initial, max_delay=s.pause_max, jitter=s.jitter, rng=rng)
        self.cooldown = wait_jittered_exponential(s.breaker_cooldown, max_delay=s.breaker_max_cooldown,
                                                  jitter=s.jitter, rng=rng)
        self._closed_until: float | None = None  # the clock() up to which a closed breaker read is trusted
        # The clock() up to which a pause of this node's calls is shown (logged, and on the pipeline and the run):
        # tens of calls in flight that fail together pause together, shown once, not one line and event each.
        self._pause_shown_until = float("-inf")
        self._pause_showing = False  # a call is logging and showing the pause now (its write not done yet)
        self._pause_lock = threading.Lock()
        # The calls of this node sleeping through a pause now. What is shown ends when the last of them tries
        # again or ends, not at the first retry or answer of any call: with tens in flight, each call's attempt
        # cleared the pause another was sleeping through, and the next call to pause showed it again (a trial: 8
        # lines and 9 events for one breaker opening, and items asleep for 53 s while nothing was shown).
        self._pausers = 0
        # This guard counted a transient failure towards the breaker and no answer has reset the count since.
        # Failures are consecutive in the order calls end: an answer to a call decided before the failure (one of
        # the tens in flight) resets the count too, or a burst of a few failures among 64 answered calls
        # would open the breaker and pause every item of the endpoint.
        self._failure_unanswered = False
        # The shared request/token budget each attempt reserves from; None: no limits.
        self.budget = budget if budget is not None and budget.limits.enabled else None
        # The pipeline's spend caps each attempt reserves from first; None: no cap.
        self.spend = spend
        # Raises when no new call may start (superseded, the run worker gone); checked before each attempt.
        self.check = check
        # The node's call journal: each attempt's ledger row is written before its request, each answer is
        # kept before the caller sees it, and a resume's same call gets the kept answer (None: off).
        self.journal = journal

    # -- one attempt ---------------------------------------------------------------------------

    def _attempt(self, call: GuardedCall, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        if self.check is not None:
            self.check()
        self.pause_retrying(call)
        store = self.store
        # a journaled request's ledger row is named now: the spend cap's reservation names it, so that after a
        # kill the row's recorded usage (if its answer was kept) settles the reservation
        call_id = uuid.uuid4().hex if call.pending is not None else None
        reservation = self._reserve(call, call_id)
        try:
            decision = self._breaker_decision(store) if store is not None else None
            if store is not None and decision is not None and not decision.allowed:
                raise CircuitOpen(self.endpoint, decision.wait_seconds, decision.state)  # no request was made
            if self.check is not None:
                self.check()  # the budget wait may have been long
            pending = call.pending
            found: Any = pending.start(self.endpoint, call.model, call_id=call_id) if pending is not None else MISS
        except BaseException:
            reservation.release()
            raise
        if found is not MISS:
            reservation.release()  # answered from the journal: no request was made
            return cast(T, found)
        held = current_reservation.set(reservation if reservation.holds else None)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            reservation.spent_unknown(exc)
            if pending is not None:
                pending.failed(exc)
            if isinstance(exc, Exception):
                self.failed(exc, decision, call.model)
            raise
        else:
            reservation.answered_without_usage()
            if pending is not None:
                pending.answered(result)  # kept before anything else happens to it
        finally:
            current_reservation.reset(held)
            if reservation.rate is not None:
                self._answered(reservation.rate)
        self.succeeded(decision)
        return result

    def failed(self, exc: Exception, decision: BreakerDecision | None, model: str | None = None) -> None:
        """An attempt failed: a transient failure counts towards the shared breaker; a refusal is an answer.

        A rate limit the provider answered (a 429, or its rate-limit error in a 200) with a rate budget shared is
        the budget's: everybody sharing it backs off for its ``Retry-After`` (at most this caller's ``max_delay``),
        and the breaker's count is left as it was (neither a failure, or a burst of them would close the endpoint
        for a cool-down far longer than that, nor an answer, or 429s among an overload's 503s would keep resetting
        it). A half-open breaker's probe answered so closes it: the provider is up. A rate limit no provider
        answered (a client's own limiter, a quota named only in words) is a failure as before."""
        store = self.store
        self._closed_until = None  # the next call reads the breaker again
        found = classify(exc)
        if self._budget_paces(found):
            assert self.budget is not None
            self.budget.back_off(model, retry_after_of(exc), max_delay=self.policy.max_delay)
            if decision is not None and decision.probe:
                self.succeeded(decision)
            return
        if store is not None and found.retryable:
            error = str(exc) or type(exc).__name__  # httpx's ReadError('') on a reset connection says nothing
            opened = store.providers.breaker_record_failure(self.endpoint, self.who,
                                                            threshold=self.settings.breaker_threshold,
                                                            cooldown=self.cooldown.delay, error=error) == "opened"
            self._failure_unanswered = True
            if opened:
                self.log(f"circuit breaker for {redact(self.endpoint)} opened: {redact(error)}")
        elif found.status_code is not None:
            self.succeeded(decision)  # it answered, if only to refuse: an answer like any other to the breaker

    def pause_retrying(self, call: GuardedCall) -> None:
        """``call``'s next attempt begins: the pause it slept through is over once no other call of this node is
        sleeping through one (the outage clock goes on)."""
        if self.pause is None or not call.pausing:  # only the call's own flow sets it: read without the lock
            return
        with self._pause_lock:  # held through the write: a call pausing meanwhile shows its pause after it
            if not call.pausing:
                return
            call.pausing = False
            self._pausers -= 1
            if not self._pausers:
                self.pause.retrying()

    def pause_ended(self, call: GuardedCall) -> None:
        """``call`` ended (answered, refused, failed or stopped): the node's outage is over once no other call of
        it is sleeping through a pause."""
        if self.pause is None:
            return
        with self._pause_lock:
            self._forget(call)
            if not self._pausers:
                self.pause.end(outage_over=True)

    def _forget(self, call: GuardedCall) -> None:
        """``call`` sleeps through no pause any more (under ``_pause_lock``)."""
        if call.pausing:
            call.pausing = False
            self._pausers -= 1

    def _budget_paces(self, found: Classification) -> bool:
        """A rate limit the provider answered (a status), with a rate budget shared: the budget's back-off paces
        the retries, not the breaker and not an outage pause."""
        return self.budget is not None and found.retryable and found.category == "rate_limit" \
            and found.status_code is not None

    def succeeded(self, decision: BreakerDecision | None) -> None:
        """An attempt was answered (a refusal too): a half-open breaker closes; a count of failures goes back
        to 0."""
        if self.store is None or decision is None:
            return
        if self._failure_unanswered:
            self._failure_unanswered = False  # before the write: a failure recorded meanwhile sets it again
            if not decision.failures:  # decided before this guard's failure: the count is above 0 now
                decision = replace(decision, failures=1)
        if self.store.providers.breaker_record_success(self.endpoint, self.who, decision):
            self.log(f"circuit breaker for {redact(self.endpoint)} closed: the probe was answered")

    def _reserve(self, call: GuardedCall, call_id: str | None) -> AttemptHold:
        """The attempt's room under the spend caps, then in the rate budget (a pause at the cap holds no rate
        budget room meanwhile)."""
        waiting_since = self.clock()
        spend = self.spend.acquire(call.estimated_tokens, call.model, ref=call_id) if self.spend is not None else None
        try:
            rate = self.budget.acquire(call.estimated_tokens, call.model) if self.budget is not None else None
        except BaseException:
            if spend is not None:
                spend.release()
            raise
        finally:
            self.not_an_outage(call, waiting_since)
        return AttemptHold(rate, spend, self.log)

    def not_an_outage(self, call: GuardedCall, since: float) -> None:
        """The call waited from ``since`` until now at a spend cap or for rate budget room: no outage, so the
        wait is left out of the call's own outage time (its first failure moves forward by it)."""
        if call.first_failure is not None:
            call.first_failure += max(0.0, self.clock() - since)

    def _answered(self, reservation: Reservation) -> None:
        """The request's room in the budget is held until one window after now. A failed write leaves it
        held as in flight (for longer, never shorter): the budget stays safe."""
        try:
            reservation.answered()
        except Exception as exc:  # noqa: BLE001 - never masks the call's own result or error
            self.log(f"could not mark a rate budget reservation answered: {redact(exc)}")

    def _breaker_decision(self, store: GuardStore) -> BreakerDecision:
        """The shared breaker's say, read from the store unless a read showed it closed with no failures
        less than ``breaker_refresh`` seconds ago (only then: an open, half-open or failing breaker is
        read before every call, so probes and cool-downs are exactly as the store decides)."""
        if self._closed_until is not None and self.clock() < self._closed_until:
            return TRUSTED_CLOSED
        decision = store.providers.breaker_before_call(self.endpoint, self.who,
                                                       probe_timeout=self.settings.probe_timeout)
        trusted = decision.allowed and decision.state == BreakerState.CLOSED and not decision.failures
        self._closed_until = self.clock() + self.settings.breaker_refresh if trusted else None
        return decision

    # -- tenacity strategies ---------------------------------------------------------------------

    def _wait(self, call: GuardedCall) -> Callable[[RetryCallState], float]:
        def within_budget(retry_state: RetryCallState) -> float:
            delay, call.pause_reason = cut_to_budget(wait(retry_state), self._outage_seconds(call),
                                                     self.settings.budget_seconds, call.pause_reason)
            return delay

        def wait(retry_state: RetryCallState) -> float:
            exc = _failure(retry_state)
            if call.first_failure is None:
                call.first_failure = self.clock()
            if isinstance(exc, CircuitOpen):
                call.pause_reason = str(exc.detail)
                return float(exc.retry_after or 0.0)
            found = classify(exc)
            category = found.category
            previous, count = call.streak
            count = count + 1 if category == previous else 1
            asked = self.policy.retry_after.asked(exc)
            # 429s in a row with a budget shared are paced by its back-off (at most max_delay), never an outage
            # pause of 30 s and more (a trial: 19 s silent after the provider took requests again); the outage
            # budget still ends a call refused for hours
            if count < self.settings.pause_after or self._budget_paces(found):
                call.streak, call.pause_reason = (category, count), None
                return asked if asked is not None else self.policy.wait.delay(count)
            call.streak, call.pauses = (category, 0), call.pauses + 1
            delay = self.pause_wait.delay(call.pauses)
            if asked is not None:
                delay = max(delay, min(asked, self.settings.pause_max))
            call.pause_reason = f"{count} {category} errors in a row from {redact(self.endpoint)}: {redact(exc)}"[:400]
            return delay

        return within_budget

    def _stop(self, call: GuardedCall) -> stop_base:
        guard = self

        class stop_after_outage_budget(stop_base):
            def __call__(self, retry_state: RetryCallState) -> bool:
                return guard._outage_seconds(call) >= guard.settings.budget_seconds

        stop: stop_base = stop_after_outage_budget()
        if self.shutdown is not None:
            stop = stop | stop_on_event(self.shutdown)
        return stop

    def _outage_seconds(self, call: GuardedCall) -> float:
        local = 0.0 if call.first_failure is None else self.clock() - call.first_failure
        shared = self.pause.elapsed() if self.pause is not None else None
        return max(local, shared or 0.0)

    def _before_sleep(self, call: GuardedCall) -> Callable[[RetryCallState], None]:
        def before_sleep(retry_state: RetryCallState) -> None:
            seconds = retry_state.upcoming_sleep
            if call.pause_reason is None:
                return
            with self._pause_lock:
                if not call.pausing and not call.stopped and self.pause is not None:
                    call.pausing = True
                    self._pausers += 1
                now = self.clock()
                # the last pauser's retry or end ends what is shown; a call still writing it shows it already
                # (tasks that fail together come here together, before the first one's write has marked the pause)
                shown = self.pause is None or self.pause.paused or self._pause_showing
                if now < self._pause_shown_until and shown:
                    return  # another call of this node shows this pause already
                self._pause_shown_until = now + seconds
                self._pause_showing = True
            try:
                self.log(f"waiting {seconds:.1f} s: {call.pause_reason}")
                if self.pause is not None:
                    self.pause.begin(seconds, call.pause_reason)
            finally:
                self._pause_showing = False

        return before_sleep

    def _give_up(self, call: GuardedCall) -> Callable[[RetryCallState], Any]:
        def give_up(retry_state: RetryCallState) -> Any:
            exc = _failure(retry_state)
            if self.shutdown is not None and self.shutdown.is_set():
                raise StopRequested("shutdown requested while waiting for the provider") from exc
            found = classify(exc)
            budget = self.settings.budget_seconds
            if self.pause is not None:
                with self._pause_lock:
                    self._forget(call)
                    self.pause.end(outage_over=False)  # the node's outage budget is spent: for every call
            raise OutageBudgetExceeded(
                exc, category=found.category, status_code=found.status_code, retryable=False,
                endpoint=self.endpoint, **{k: v for k, v in self.policy.context.items() if k != "endpoint"},
                message=f"gave up: {redact(self.endpoint)} stayed unavailable for {self._outage_seconds(call):.1f} s "
                        f"and used up the outage budget of {budget:g} s; last error: {redact(exc)}",
            ) from exc

        return give_up

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn`` until it succeeds, fails permanently, or the outage budget is spent."""
        return self.metered(0, None, fn, *args, **kwargs)

    def metered(self, estimated_tokens: int, model: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """:meth:`call`, each attempt first reserving one request and ``estimated_tokens`` (an upper bound: the
        prompt and the most the answer may hold) from the endpoint's shared budget. A call recorded with
        :func:`record_provider_call` during the attempt corrects the reservation to its usage.

        With a journal the call is keyed by ``fn``, its arguments and what its closure holds, when all of them
        are JSON values (else only its ledger row is written before the request); see :meth:`request`."""
        pending = None
        if self.journal is not None:
            pending = self.journal.open(endpoint=self.endpoint, fingerprinted=function_fingerprint(
                self.endpoint, model, fn, args, kwargs))
        return self._guarded(GuardedCall(estimated_tokens=max(0, int(estimated_tokens)), model=model, pending=pending),
                             fn, args, kwargs)

    def request(self, request: Any, fn: Callable[..., T], *args: Any, estimated_tokens: int = 0,
                model: str | None = None, key: str | None = None, fresh: bool = False, **kwargs: Any) -> T:
        """:meth:`metered` for a call journaled under ``request`` (a JSON value, the body sent) or ``key``
        (an idempotency key); ``fresh=True`` asks the provider again instead of replaying."""
        pending = None
        if self.journal is not None:
            pending = self.journal.open(endpoint=self.endpoint, request=request, key=key, fresh=fresh)
        return self._guarded(GuardedCall(estimated_tokens=max(0, int(estimated_tokens)), model=model, pending=pending),
                             fn, args, kwargs)

    def strategies(self, call: GuardedCall) -> dict[str, Any]:
        """tenacity's strategies for ``call``: the same for a thread (``Retrying``) and an event loop."""
        return dict(retry=retry_provider_failures(), wait=self._wait(call), stop=self._stop(call),
                    before_sleep=self._before_sleep(call), retry_error_callback=self._give_up(call), reraise=True)

    def _guarded(self, call: GuardedCall, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        retrying = tenacity.Retrying(sleep=self.sleep, **self.strategies(call))
        try:
            result: T = retrying(self._attempt, call, fn, args, kwargs)
        except BaseException as exc:
            self.pause_after(call, exc)
            raise
        self.pause_after(call, None)
        return result

    @staticmethod
    def ends_outage(exc: BaseException | None) -> bool:
        """Whether a call that ended so was answered or refused by the provider (None: answered), which ends its
        node's outage; a stop, a cancellation or a spent outage budget does not."""
        stopped = isinstance(exc, (StopRequested, OutageBudgetExceeded))
        return exc is None or (isinstance(exc, Exception) and not stopped)

    def pause_after(self, call: GuardedCall, exc: BaseException | None) -> None:
        """``call`` ended (``exc``: how; None: answered): :meth:`pause_ended` or :meth:`pause_stopped` (a thread's)."""
        if self.ends_outage(exc):
            self.pause_ended(call)
        else:
            self.pause_stopped(call)

    def pause_stopped(self, call: GuardedCall) -> None:
        """``call`` was stopped or cancelled: it sleeps through no pause, and shows nothing about the outage. No
        write of its own, but it may wait for the lock another call holds through one: an event loop calls it in a
        worker thread."""
        with self._pause_lock:
            call.stopped = True
            self._forget(call)
