"""A 429 closes the endpoint's shared budget for everybody (SQLite and PostgreSQL): no reservation is granted,
in any process, until the back-off ends; 429s in a row double it; afterwards the budget grants again."""

from __future__ import annotations

import time

import pytest

from recovery_ext import ProviderLimits
from recovery_pipelines.devserver import wait_for

LIMITS = ProviderLimits(requests_per_minute=100, window_seconds=5.0, margin_seconds=0.0)
ENDPOINT = "http://e/v1"


def reserve(store, model=None):
    return store.providers.budget_reserve(ENDPOINT, model, tokens=1, limits=LIMITS, holder="someone-else")


def test_a_429_closes_the_shared_budget_until_the_back_off_ends_then_it_grants_again(store):
    assert reserve(store).granted
    assert store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS, retry_after=3.0) == 3.0
    refused = reserve(store, model="another-model")  # one budget for the whole endpoint: every caller waits
    assert not refused.granted and 2.0 < refused.wait_seconds <= 3.0
    # a shorter back-off asked later never shortens the one in force
    assert 2.0 < store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS, retry_after=0.1) <= 3.0


def test_429s_in_a_row_without_retry_after_double_the_back_off_up_to_the_window(store):
    assert reserve(store).granted
    first = store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS)
    second = store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS)
    assert first == 0.5 and 0.9 < second <= 1.0
    waits = [store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS) for _ in range(6)]
    assert max(waits) <= LIMITS.window_seconds


def test_the_budget_recovers_once_the_back_off_is_over(store):
    assert reserve(store).granted
    store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS, retry_after=1.5)  # long enough to be seen
    assert not reserve(store).granted
    deadline = time.monotonic() + 10
    while not (grant := reserve(store)).granted and time.monotonic() < deadline:
        time.sleep(min(grant.wait_seconds, 0.1))
    assert grant.granted


def test_a_back_off_before_any_reservation_holds_nothing_back(store):
    assert store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS, retry_after=3.0) == 0.0
    assert reserve(store).granted


WIDE = ProviderLimits(requests_per_minute=100, window_seconds=3600.0, margin_seconds=0.0)


def test_a_huge_retry_after_closes_the_budget_no_longer_than_the_callers_cap(store):
    """A 429 saying Retry-After: 3600 with max_delay 2 s closes the budget for 2 s, not the hour-long window:
    the deadline written is the database clock plus the cap."""
    assert store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE).granted
    assert store.providers.budget_back_off(ENDPOINT, None, limits=WIDE, retry_after=3600.0, max_delay=2.0) == 2.0
    refused = store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE)
    assert not refused.granted and 1.0 < refused.wait_seconds <= 2.0


@pytest.mark.parametrize("asked", [float("inf"), float("nan"), -30.0, 1e300, None])
def test_no_retry_after_closes_the_budget_past_the_cap(store, asked):
    """Absurd values (a parsed far-future date, NaN, negative, none at all) stay within [0, max_delay]."""
    assert store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE).granted
    closed = store.providers.budget_back_off(ENDPOINT, None, limits=WIDE, retry_after=asked, max_delay=1.5)
    assert 0.0 <= closed <= 1.5
    grant = store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE)
    assert grant.granted or grant.wait_seconds <= 1.5


def test_a_shorter_cap_never_shortens_a_back_off_in_force(store):
    """Two callers of one endpoint with caps of 3 s and 1 s: the longer back-off stands, and nobody's exceeds
    the longest cap."""
    assert store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE).granted
    assert store.providers.budget_back_off(ENDPOINT, None, limits=WIDE, retry_after=3600.0, max_delay=3.0) == 3.0
    assert 2.0 < store.providers.budget_back_off(ENDPOINT, None, limits=WIDE, retry_after=3600.0, max_delay=1.0) <= 3.0
    refused = store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE)
    assert not refused.granted and 2.0 < refused.wait_seconds <= 3.0


def test_a_guarded_call_refused_for_its_rate_backs_everybody_off_and_is_an_answer_to_the_breaker(store):
    """Any guarded call (``provider_guard``'s too, not only LLMResource's transport): with a budget shared, a 429
    closes the budget for its Retry-After, capped by the caller's max_delay, and the breaker hears an answer (a burst
    of them opened it for a cool-down far longer than the cap). Without a budget the breaker counts it: it is then
    the only back-off shared with the others."""
    import httpx

    from recovery_ext._classify.retry import RetryPolicy
    from recovery_ext._errors import StopRequested
    from recovery_ext._providers.budget import RateBudget
    from recovery_ext._providers.guard import OutageSettings, ProviderGuard

    request = httpx.Request("POST", ENDPOINT)
    refusal = httpx.HTTPStatusError("429 Too Many Requests", request=request,
                                    response=httpx.Response(429, headers={"Retry-After": "3600"}, request=request))
    def refuse():
        raise refusal

    def one_attempt_only(_seconds: float) -> None:
        """The guard's sleep before a retry: it stops the call instead (the guard would go on retrying for its
        outage budget), so the test reads what the one attempt left."""
        raise StopRequested("one attempt only")

    once = OutageSettings(breaker_threshold=1)  # one failure counted would open it
    shared = ProviderGuard(ENDPOINT, store=store, settings=once, policy=RetryPolicy(max_delay=2.0),
                           budget=RateBudget(store, ENDPOINT, WIDE), sleep=one_attempt_only)
    with pytest.raises(StopRequested):
        shared.metered(1, "m", refuse)
    refused = store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=WIDE, holder="someone-else")
    assert not refused.granted and 1.0 < refused.wait_seconds <= 2.0
    assert store.providers.breakers() == []  # nothing counted towards it
    with pytest.raises(StopRequested):
        ProviderGuard(ENDPOINT, store=store, settings=once, sleep=one_attempt_only).call(refuse)
    assert [row["state"] for row in store.providers.breakers()] == ["open"]


def _refusal(status: int):
    import httpx

    request = httpx.Request("POST", ENDPOINT)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=httpx.Response(status, request=request))


def _shared_guard(store, who: str = "guard", **settings):
    from recovery_ext._providers.budget import RateBudget
    from recovery_ext._providers.guard import OutageSettings, ProviderGuard

    assert store.providers.budget_reserve(ENDPOINT, None, tokens=1, limits=LIMITS).granted  # the budget's row
    return ProviderGuard(ENDPOINT, store=store, settings=OutageSettings(jitter=0.0, **settings), who=who,
                         budget=RateBudget(store, ENDPOINT, LIMITS))


def test_429s_among_an_outages_503s_leave_the_breakers_count_as_it_was(store):
    """A review: a 429 with a budget counted as an answer, so one among every four 503s reset the count and an
    overload reported partly as 429 never opened the breaker. It is neither a failure nor an answer to the count."""
    guard = _shared_guard(store, breaker_threshold=5)
    for status in (503, 503, 429, 503, 429, 503):  # each decided as a call decides, before its request
        guard.failed(_refusal(status), store.providers.breaker_before_call(ENDPOINT, "guard", probe_timeout=30))
    assert [(row["state"], row["consecutive_failures"]) for row in store.providers.breakers()] == [("closed", 4)]
    guard.failed(_refusal(503), None)
    assert [row["state"] for row in store.providers.breakers()] == ["open"]


def test_a_rate_limit_no_provider_answered_counts_towards_the_breaker(store):
    """A review: a rate limit named only in words (a client's own limiter, "quota exceeded" in a message) has no
    status: nothing says the provider answered, so it is a transient failure like any other, not the budget's."""
    guard = _shared_guard(store, breaker_threshold=1)
    guard.failed(RuntimeError("Quota exceeded for quota metric 'Requests per day'"), None)
    assert [row["state"] for row in store.providers.breakers()] == ["open"]
    assert reserve(store).granted  # and it backed nobody off


def test_a_half_open_probe_answered_with_a_429_closes_the_breaker(store):
    """The probe's 429 says the provider is up: the breaker closes, and the budget's back-off paces the callers."""
    guard = _shared_guard(store, "prober", breaker_threshold=1, breaker_cooldown=0.2)
    guard.failed(_refusal(503), None)
    assert [row["state"] for row in store.providers.breakers()] == ["open"]
    decision = wait_for(lambda: (d := store.providers.breaker_before_call(ENDPOINT, "prober", probe_timeout=30)).probe
                        and d, timeout=20, interval=0.05, what="the breaker's half-open probe")
    guard.failed(_refusal(429), decision)
    assert [row["state"] for row in store.providers.breakers()] == ["closed"]
    assert not reserve(store).granted  # the back-off holds the others meanwhile


def test_a_wait_for_the_back_off_says_it_is_one(store):
    """A trial: a pipeline held back by a 429's back-off showed `rate budget: ...: 0 requests and 0 tokens in the
    last 60 s`, as if the window were full. The wait now says what it is."""
    import threading

    from recovery_ext._errors import StopRequested
    from recovery_ext._providers.budget import RateBudget

    shown: list[tuple[float, str]] = []
    stop = threading.Event()

    def show_wait(seconds: float, reason: str) -> None:
        shown.append((seconds, reason))
        stop.set()  # the test reads what was shown; the wait itself is not waited

    assert reserve(store).granted
    store.providers.budget_back_off(ENDPOINT, None, limits=LIMITS, retry_after=3.0)
    with pytest.raises(StopRequested):
        RateBudget(store, ENDPOINT, LIMITS, show_wait=show_wait, stop=stop).acquire(1)
    ((seconds, reason),) = shown
    assert 2.0 < seconds <= 3.0
    assert reason == f"{ENDPOINT}: the provider refused for its rate limit, everybody sharing it backs off"


class _ShownPauses:
    """A pause target that records the pauses a guard shows (the pipeline row's ``waiting``)."""

    paused = False

    def __init__(self) -> None:
        self.begun: list[tuple[float, str]] = []

    def begin(self, seconds: float, reason: str) -> None:
        self.begun.append((seconds, reason))

    def retrying(self) -> None:
        pass

    def end(self, *, outage_over: bool) -> None:
        pass

    def elapsed(self) -> float | None:
        return None


def test_429s_in_a_row_with_a_budget_are_paced_by_its_back_off_not_an_outage_pause(store):
    """A trial: five 429s in a row on one call (Retry-After: 1, a budget set) paused it for 30 s, then 60 s, as an
    outage, the endpoint silent long after the provider took requests again. With a budget they are the budget's:
    each retry waits its back-off, capped by max_delay, and no pause is shown."""
    from recovery_ext._classify.retry import RetryPolicy
    from recovery_ext._providers.budget import RateBudget
    from recovery_ext._providers.guard import OutageSettings, ProviderGuard

    refusals = 7  # more than pause_after
    sent: list[int] = []
    waits: list[float] = []

    def ask() -> str:
        sent.append(1)
        if len(sent) <= refusals:
            raise _refusal(429)
        return "answered"

    shown = _ShownPauses()
    guard = ProviderGuard(ENDPOINT, store=store, settings=OutageSettings(jitter=0.0, pause_after=5), pause=shown,
                          policy=RetryPolicy(initial_delay=0.01, max_delay=0.05, jitter=0.0), sleep=waits.append,
                          budget=RateBudget(store, ENDPOINT, LIMITS))
    assert guard.metered(1, "m", ask) == "answered"
    assert len(sent) == refusals + 1
    assert shown.begun == []
    assert len(waits) == refusals and max(waits) <= 0.05
