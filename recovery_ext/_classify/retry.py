"""The retry policy, on tenacity: jittered exponential backoff, same-error escalation, shutdown.

Two ways to use it:

* ready-made: ``@retrying(max_attempts=5)`` as a decorator, or
  ``for attempt in retrying(): with attempt: ...`` as a context;
* building blocks that compose with tenacity's own through ``|`` and ``&``:
  :func:`retry_if_retryable`, :class:`stop_after_same_error`, :class:`wait_jittered_exponential`.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity
from tenacity import RetryCallState
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from recovery_ext._classify.classifier import ClassifiedError, classify, retry_after_of
from recovery_ext._errors import ConfigurationError, StopRequested

T = TypeVar("T")


class wait_jittered_exponential(wait_base):
    """``min(max_delay, initial * multiplier**(n-1))``, then ``± jitter`` of that (0 disables)."""

    def __init__(self, initial: float = 1.0, *, multiplier: float = 2.0, max_delay: float = 60.0,
                 jitter: float = 0.1, rng: random.Random | None = None) -> None:
        if initial < 0 or max_delay < 0 or multiplier < 1:
            raise ConfigurationError("backoff needs initial >= 0, max_delay >= 0 and multiplier >= 1")
        if not 0.0 <= jitter <= 1.0:
            raise ConfigurationError(f"jitter must be between 0 and 1, got {jitter}")
        self.initial, self.multiplier, self.max_delay, self.jitter = initial, multiplier, max_delay, jitter
        self.rng = rng or random.Random()

    def base_delay(self, attempt_number: int) -> float:
        exponent = max(0, attempt_number - 1)
        try:
            delay = self.initial * self.multiplier**exponent
        except OverflowError:
            delay = self.max_delay
        return min(self.max_delay, delay)

    def bounds(self, attempt_number: int) -> tuple[float, float]:
        base = self.base_delay(attempt_number)
        return base * (1 - self.jitter), base * (1 + self.jitter)

    def delay(self, attempt_number: int) -> float:
        base = self.base_delay(attempt_number)
        if not self.jitter:
            return base
        return max(0.0, base * (1 + self.jitter * self.rng.uniform(-1.0, 1.0)))

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.delay(retry_state.attempt_number)


class wait_retry_after(wait_base):
    """A 429 or 503 that says ``Retry-After`` (seconds or an HTTP date) is waited exactly that long,
    up to ``max_delay``; any other failure waits what ``fallback`` says."""

    def __init__(self, fallback: wait_base, *, max_delay: float, clock: Callable[[], float] | None = None) -> None:
        self.fallback, self.max_delay, self.clock = fallback, max_delay, clock or time.time

    def asked(self, exc: BaseException | None) -> float | None:
        """The delay the server asked for, within ``max_delay``; None when it asked nothing."""
        if exc is None:
            return None
        seconds = retry_after_of(exc, now=self.clock())
        return None if seconds is None else min(seconds, self.max_delay)

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        asked = self.asked(outcome.exception() if outcome is not None and outcome.failed else None)
        return self.fallback(retry_state) if asked is None else asked


class retry_if_retryable(retry_base):
    """Retry when the shared classifier calls the exception retryable."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        return exc is not None and classify(exc).retryable


class stop_after_same_error(stop_base):
    """Stop after ``n`` consecutive failures of the same category; another category resets the count."""

    def __init__(self, n: int = 5) -> None:
        if n < 1:
            raise ConfigurationError(f"same-error escalation needs n >= 1, got {n}")
        self.n = n

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        if exc is None:
            return False
        category = classify(exc).category
        previous, count = getattr(retry_state, "_rx_same_error", (None, 0))
        count = count + 1 if category == previous else 1
        # the count belongs to this one retried call, so it lives on tenacity's per-call state
        retry_state._rx_same_error = (category, count)  # type: ignore[attr-defined]
        return count >= self.n


class stop_on_event(stop_base):
    """Stop as soon as a shutdown event is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.event.is_set()


def event_sleep(event: threading.Event) -> Callable[[float], None]:
    """A sleep that a shutdown event interrupts at once."""

    def sleep(seconds: float) -> None:
        if event.wait(seconds):
            raise StopRequested("shutdown requested while waiting to retry")

    return sleep


class EscalatedError(ClassifiedError):
    """The same kind of error kept coming back; it is treated as permanent."""


def without_escalation(exc: Exception) -> Exception:
    """The transient error an :class:`EscalatedError` made permanent, else ``exc`` itself.

    Inside a recoverable node the node escalates on its own: a streak of transient errors pauses its pipeline,
    and only the outage budget gives up. A ``retrying()`` or ``resource.retry_policy()`` a body (or a mapped
    item) calls itself must not turn a provider's busy stretch into a failure for good. Found the same way in an
    ``ExceptionGroup`` (a body's ``asyncio.TaskGroup``: its members undone, the group kept) and under the body's
    own exception around it (``raise MyError(...) from escalated``: the transient error it escalated)."""
    if isinstance(exc, EscalatedError):
        cause = exc.__cause__
        return cause if isinstance(cause, Exception) and classify(cause).retryable else exc
    if isinstance(exc, ExceptionGroup):
        members = [without_escalation(member) for member in exc.exceptions]
        if all(new is old for new, old in zip(members, exc.exceptions, strict=True)):
            return exc
        group = exc.derive(members)
        group.__cause__, group.__context__ = exc.__cause__, exc.__context__
        return group
    escalated = exc.__cause__
    if isinstance(escalated, EscalatedError) and not isinstance(exc, ClassifiedError):
        undone = without_escalation(escalated)
        return exc if undone is escalated else undone
    return exc


@dataclass
class RetryPolicy:
    """Settings for one retrying call; build with :func:`retrying`."""

    max_attempts: int = 10
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    same_error_limit: int = 5
    shutdown: threading.Event | None = None
    sleep: Callable[[float], None] | None = None
    rng: random.Random | None = None
    before_sleep: Callable[[RetryCallState], None] | None = None
    context: dict[str, Any] = field(default_factory=dict)
    clock: Callable[[], float] | None = None  # wall clock for Retry-After HTTP dates (tests inject one)
    # False: a same-error streak stops the retries and the last error goes on unchanged, for a caller that
    # escalates on its own (a map's items: their node pauses on a transient error, see the node's error path).
    # Last, so that no positional argument moves.
    escalate: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        self.wait = wait_jittered_exponential(self.initial_delay, multiplier=self.multiplier,
                                              max_delay=self.max_delay, jitter=self.jitter, rng=self.rng)
        self.same_error = stop_after_same_error(self.same_error_limit)
        self.retry_after = wait_retry_after(self.wait, max_delay=self.max_delay, clock=self.clock)

    def build(self) -> tenacity.Retrying:
        stop: stop_base = tenacity.stop_after_attempt(self.max_attempts) | self.same_error
        sleep = self.sleep or time.sleep
        if self.shutdown is not None:
            stop = stop | stop_on_event(self.shutdown)
            sleep = event_sleep(self.shutdown) if self.sleep is None else self.sleep
        return tenacity.Retrying(
            stop=stop, wait=self.retry_after, retry=retry_if_retryable(), sleep=sleep,
            before_sleep=self.before_sleep, retry_error_callback=self._give_up,
        )

    def _give_up(self, retry_state: RetryCallState) -> Any:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if self.shutdown is not None and self.shutdown.is_set():
            raise StopRequested("shutdown requested; retrying stopped") from exc
        category, count = getattr(retry_state, "_rx_same_error", (None, 0))
        if exc is not None and count >= self.same_error_limit and self.escalate:
            found = classify(exc)
            raise EscalatedError(
                exc, category=found.category, status_code=found.status_code, retryable=False,
                message=f"repeated {category} error ({count} times): {exc}", **self.context,
            ) from exc
        if exc is not None:
            raise exc
        return retry_state.outcome.result() if retry_state.outcome else None

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.build()(fn, *args, **kwargs)

        return wrapper

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self.build()(fn, *args, **kwargs)

    def __iter__(self) -> Iterator[tenacity.AttemptManager]:
        return iter(self.build())


def retrying(**settings: Any) -> RetryPolicy:
    """The project's retry policy: a decorator (``@retrying()``) and a context (``for attempt in retrying()``)."""
    return RetryPolicy(**settings)
