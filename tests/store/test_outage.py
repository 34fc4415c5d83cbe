"""Provider outages against a real HTTP server on 127.0.0.1: Retry-After, pauses, the budget, the breaker.

Waits are asserted exactly: the guard's sleep is injected, and it advances an injected clock.
"""

from __future__ import annotations

import email.utils
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from sqlalchemy import select

from helpers import expire
from outage_kit import NOW, FakeTime, answer, enricher, plain_guard, serve, store_guard

from recovery_ext._classify.classifier import classify
from recovery_pipelines.devserver import wait_for
from recovery_ext._errors import ConfigurationError
from recovery_ext._store.models import NodeSpec
from recovery_ext._providers.guard import OutageBudgetExceeded, OutageSettings, ProviderGuard
from recovery_ext._classify.retry import RetryPolicy
from recovery_ext._store.schema import circuit_breakers

# -- Retry-After ----------------------------------------------------------------------------------------

def test_retry_after_seconds_and_http_date_are_waited_exactly_on_429_and_503(httpserver):
    date = email.utils.formatdate(NOW + 12, usegmt=True)
    seen = serve(httpserver, [answer(429, "7"), answer(503, date), answer(503), answer(200)])
    fake = FakeTime()
    assert enricher(httpserver, guard_for=plain_guard(fake)).complete_json("glossary", {}) == {"ok": True}
    # 7 s and 12 s as asked; the 503 without Retry-After backs off 2 s (third error of the streak... second 503)
    assert fake.slept == [7.0, 12.0, 2.0] and len(seen) == 4


def test_retry_after_is_capped_by_the_policys_maximum_delay(httpserver):
    serve(httpserver, [answer(429, "500"), answer(503, "86400"), answer(200)])
    fake = FakeTime()
    assert enricher(httpserver, guard_for=plain_guard(fake), max_delay=30.0).complete_json("glossary", {})
    assert fake.slept == [30.0, 30.0]


def test_retry_after_on_other_statuses_is_ignored_and_permanent_errors_fail_at_once(httpserver):
    seen = serve(httpserver, [answer(400, "5")])
    fake = FakeTime()
    with pytest.raises(Exception) as info:
        enricher(httpserver, guard_for=plain_guard(fake)).complete_json("glossary", {})
    assert classify(info.value).retryable is False and fake.slept == [] and len(seen) == 1


def test_the_plain_retry_policy_honours_retry_after_too(httpserver):
    serve(httpserver, [answer(429, "3"), answer(200)])
    slept: list[float] = []
    client = openai.OpenAI(base_url=httpserver.url_for("/v1"), api_key="k", max_retries=0)
    policy = RetryPolicy(sleep=slept.append, jitter=0.0, clock=lambda: NOW)
    policy.call(lambda: client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]))
    assert slept == [3.0]


# -- pauses and the outage budget -------------------------------------------------------------------------

def _pipeline(store):
    own = store.pipelines.create_pipeline("job", [NodeSpec("n")], owner="run-1")
    store.pipelines.start_node(own, "n")
    return own


def test_n_errors_of_one_category_pause_the_pipeline_which_shows_waiting_then_runs_again(store, httpserver):
    own = _pipeline(store)
    seen = serve(httpserver, [answer(503)] * 7 + [answer(200)])
    shown = []
    fake = FakeTime(on_sleep=lambda s: shown.append(store.pipelines.get_pipeline(own.pipeline_id).shown_status))

    build = store_guard(fake, store, own, pause_after=3, pause_initial=10, pause_max=60)
    assert enricher(httpserver, guard_for=build).complete_json("glossary", {}) == {"ok": True}
    assert fake.slept == [1.0, 2.0, 10.0, 1.0, 2.0, 20.0, 1.0] and len(seen) == 8
    assert shown == ["running", "running", "waiting", "running", "running", "waiting", "running"]
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert p.status == "running" and p.waiting_until is None and p.waiting_since is None
    kinds = [e["kind"] for e in store.reports.recent_events()]
    assert kinds.count("pipeline_waiting") == 2 and "pipeline_waiting_over" in kinds
    waiting = next(e for e in store.reports.recent_events() if e["kind"] == "pipeline_waiting")
    assert "3 server_error errors in a row" in waiting["payload"]["reason"] and waiting["payload"]["next_try_at"]


def test_the_outage_budget_gives_up_with_a_clear_reason(store, httpserver):
    own = _pipeline(store)
    seen = serve(httpserver, [answer(503)])
    fake = FakeTime()

    llm = enricher(httpserver, guard_for=store_guard(fake, store, own, pause_after=2, pause_initial=30, pause_max=60,
                                                     budget_seconds=120))
    with pytest.raises(OutageBudgetExceeded) as info:
        llm.complete_json("glossary", {})
    assert "used up the outage budget of 120 s" in str(info.value) and info.value.retryable is False
    assert sum(fake.slept) >= 120 and classify(info.value).retryable is False
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert p.shown_status == "running" and p.waiting_since is not None  # the budget is spent for this pipeline
    calls = len(seen)
    expire(store, own.pipeline_id, column="waiting_since", ago=200)  # the outage clock is the database's
    with pytest.raises(OutageBudgetExceeded):  # the next item of the same pipeline gives up after one failure
        llm.complete_json("glossary", {})
    assert len(seen) == calls + 1


# -- the circuit breaker in the store ------------------------------------------------------------------

def _cooled_down(store, endpoint: str) -> bool:
    """Whether the open breaker's cool-down is over, on the database clock (a read: it takes no probe)."""
    with store.read() as conn:
        return bool(conn.scalar(select(circuit_breakers.c.open_until <= store.dialect.now())
                                .where(circuit_breakers.c.endpoint == endpoint)))


def test_breaker_opens_once_under_concurrent_failures_and_one_probe_closes_it(store):
    endpoint = "http://llm.local/v1"
    opened = []
    barrier = threading.Barrier(8)

    def fail(i):
        barrier.wait()
        # a cool-down long enough that the check below lands inside it on a loaded machine
        opened.append(store.providers.breaker_record_failure(endpoint, f"w{i}", threshold=5, cooldown=lambda n: 1.0,
                                                             error="HTTP 503"))

    threads = [threading.Thread(target=fail, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opened.count("opened") == 1
    (row,) = store.providers.breakers()
    assert row["state"] == "open" and row["consecutive_failures"] == 5
    decision = store.providers.breaker_before_call(endpoint, "x", probe_timeout=5)
    assert not decision.allowed and 0 < decision.wait_seconds <= 1.0
    wait_for(lambda: _cooled_down(store, endpoint), timeout=30, interval=0.05, what="the breaker's cool-down")
    decisions = [store.providers.breaker_before_call(endpoint, f"p{i}", probe_timeout=5) for i in range(4)]
    probes = [d for d in decisions if d.probe]
    assert len(probes) == 1 and not any(d.allowed for d in decisions if not d.probe)
    prober = f"p{decisions.index(probes[0])}"
    assert store.providers.breaker_record_success(endpoint, "p-other", decisions[-1] if not decisions[-1].probe else
                                        decisions[0]) is False
    assert store.providers.breaker_record_success(endpoint, prober, probes[0]) is True
    assert store.providers.breakers()[0]["state"] == "closed"
    assert store.providers.breaker_before_call(endpoint, "y", probe_timeout=5).allowed
    kinds = [e["kind"] for e in store.reports.recent_events()]
    assert kinds.count("breaker_opened") == 1 and kinds.count("breaker_half_open") == 1 and "breaker_closed" in kinds


def test_a_failed_probe_reopens_with_a_longer_cooldown(store):
    endpoint = "http://llm.local/v1"
    cooldowns = {1: 0.05, 2: 30.0}
    assert (
        store.providers.breaker_record_failure(endpoint, "a", threshold=1, cooldown=cooldowns.get, error="503")
        == "opened"
    )
    probe = wait_for(lambda: (d := store.providers.breaker_before_call(endpoint, "a", probe_timeout=5)).probe and d,
                     timeout=10, interval=0.02, what="the 0.05 s cooldown to end")
    assert probe.probe
    assert (
        store.providers.breaker_record_failure(endpoint, "b", threshold=1, cooldown=cooldowns.get, error="503") is None
    )
    assert (
        store.providers.breaker_record_failure(endpoint, "a", threshold=1, cooldown=cooldowns.get, error="503")
        == "opened"
    )
    decision = store.providers.breaker_before_call(endpoint, "c", probe_timeout=5)
    assert not decision.allowed and decision.wait_seconds > 20
    assert store.providers.breakers()[0]["open_count"] == 2


def test_a_breaker_cool_down_longer_than_the_outage_budget_gives_up_at_the_budget(store):
    """A review found it: with a budget of 5 s and cool-downs of 30 s, a call slept through the 30 s cool-down and
    gave up then. No wait runs past the budget now: the call tries once more when it is spent, then gives up."""
    fake, logged = FakeTime(), []
    guard = ProviderGuard("http://llm.local/v1", policy=RetryPolicy(initial_delay=1.0, jitter=0.0), store=store,
                          sleep=fake.sleep, clock=fake.clock, log=logged.append,
                          settings=OutageSettings(jitter=0.0, pause_after=100, breaker_threshold=1, budget_seconds=5.0,
                                                  breaker_cooldown=30.0, breaker_max_cooldown=30.0))
    attempts = []

    def down():
        attempts.append(fake.now)
        raise ConnectionResetError("the provider dropped the connection")

    with pytest.raises(OutageBudgetExceeded, match="outage budget of 5 s"):
        guard.call(down)
    # the failure opened the breaker (threshold 1); its cool-down (about 30 s, on the database clock) is waited
    # only up to the budget: 1 s of back-off, then the 4 s left; the last try finds the breaker open and gives up
    assert attempts == [0.0] and fake.slept == [1.0, 4.0] and fake.now == 5.0
    (shown,) = [line for line in logged if line.startswith("waiting 4.0 s: ")]
    assert "circuit breaker is open" in shown and "waiting only the 4.0 s left of the outage budget" in shown, shown


def test_a_closed_breaker_is_read_once_per_refresh_and_again_after_any_failure(store, monkeypatch):
    """One breaker read per LLM request was a round trip each; a node now trusts a read that found the
    breaker closed with no failures for ``breaker_refresh`` seconds of its clock, and no longer."""
    endpoint = "http://llm.local/v1"
    reads = []
    read_for_real = store.providers.breaker_before_call

    def counted(*args, **kwargs):
        decision = read_for_real(*args, **kwargs)
        reads.append(decision.state)
        return decision

    monkeypatch.setattr(store.providers, "breaker_before_call", counted)
    fake = FakeTime()
    guard = ProviderGuard(endpoint, policy=RetryPolicy(initial_delay=1.0, jitter=0.0), store=store, sleep=fake.sleep,
                          clock=fake.clock, settings=OutageSettings(jitter=0.0, breaker_refresh=5.0,
                                                                    breaker_threshold=100, budget_seconds=60))
    calls = []

    def provider(outcome="ok"):
        calls.append(outcome)
        if outcome == "reset":
            raise ConnectionResetError("the provider dropped the connection")
        return outcome

    assert [guard.call(provider) for _ in range(3)] == ["ok"] * 3 and reads == ["closed"]
    fake.now += 4.9
    guard.call(provider)
    assert reads == ["closed"]
    # a transient failure (its attempt still trusted the read): the retry reads again, and so does the
    # call after it, because that read found the failure counted
    outcomes = iter(["reset", "ok"])
    assert guard.call(lambda: provider(next(outcomes))) == "ok"
    assert reads == ["closed"] * 2 and fake.slept == [1.0]
    guard.call(provider)
    assert reads == ["closed"] * 3
    guard.call(provider)
    assert reads == ["closed"] * 3  # the success reset the count: trusted again
    # another process opens the breaker: seen at the next read, within breaker_refresh of the last one
    assert store.providers.breaker_record_failure(endpoint, "elsewhere", threshold=1, cooldown=lambda n: 600,
                                        error="503") == "opened"
    fake.now += 5.0
    before = len(calls)
    with pytest.raises(OutageBudgetExceeded):
        guard.call(provider)
    assert len(calls) == before and reads[3:] and set(reads[3:]) == {"open"}  # every wait read it again
    # 0 reads before every call
    every = ProviderGuard(endpoint + "/other", store=store, sleep=fake.sleep, clock=fake.clock,
                          settings=OutageSettings(breaker_refresh=0.0))
    read_before = len(reads)
    for _ in range(3):
        every.call(provider)
    assert len(reads) == read_before + 3


@pytest.mark.parametrize("refresh", [-1.0, 61.0, float("nan"), float("inf")])
def test_a_breaker_refresh_out_of_range_is_refused(refresh):
    with pytest.raises(ConfigurationError, match="breaker_refresh"):
        OutageSettings(breaker_refresh=refresh)


def test_a_waiting_pipeline_is_named_in_the_sensor_tick_and_status_and_stays_an_orphan_candidate(store, db_url):
    from click.testing import CliRunner
    from dagster import DagsterInstance, build_sensor_context
    from e2e_defs import items_job

    from recovery_ext._cli import main
    from recovery_ext import RecoveryResource, make_orphan_sensor

    own = store.pipelines.create_pipeline("items_job", [NodeSpec("n")], owner="run-w")
    store.providers.set_waiting(own, 60, "5 server_error errors in a row from http://llm.local/v1")
    with DagsterInstance.ephemeral() as instance:
        tick = make_orphan_sensor([items_job]).evaluate_tick(
            build_sensor_context(
                instance=instance, resources={"recovery": RecoveryResource(database_url=db_url, deployment="default")}
            )
        )
    assert f"waiting on provider outages: pipeline {own.pipeline_id} next try" in tick.skip_message
    assert "5 server_error errors in a row" in tick.skip_message
    status = CliRunner().invoke(main, ["--database-url", db_url, "status"]).stdout
    assert f"pipeline {own.pipeline_id} (items_job) waiting, next try" in status
    # its process dies: the heartbeat expires and it is an orphan like any live pipeline
    expire(store, own.pipeline_id)
    assert [o.id for o in store.recovery.find_orphans()] == [own.pipeline_id]


def test_a_breaker_opened_by_errors_with_no_message_names_their_type(store):
    """httpx raises ReadError('') when a connection is reset mid-request: the breaker's error and the log line that
    says it opened name the error's type rather than nothing."""
    import httpx

    endpoint = "http://127.0.0.1:9/v1"
    lines: list[str] = []
    guard = ProviderGuard(endpoint, store=store, sleep=FakeTime().sleep, log=lines.append,
                          settings=OutageSettings(jitter=0.0, breaker_threshold=2))
    for _ in range(2):
        guard.failed(httpx.ReadError(""), None)
    (row,) = store.providers.breakers()
    assert row["state"] == "open" and row["last_error"] == "ReadError"
    assert lines == [f"circuit breaker for {endpoint} opened: ReadError"]


def _fail_while_in_flight(store, guard, call, decided: threading.Event, release: threading.Event) -> None:
    """``call()`` in a thread; once its request was decided (``decided``), another call of the node fails (one
    failure counted), then the request is let go (``release``) and its thread joined."""
    caller = threading.Thread(target=call)
    caller.start()
    assert decided.wait(30)
    guard.failed(ConnectionResetError("refused"), None)
    assert [row["consecutive_failures"] for row in store.providers.breakers()] == [1]
    release.set()
    caller.join(30)


def test_an_answer_after_a_failure_resets_the_count_even_for_a_call_decided_before_the_failure(store):
    """Failures are consecutive in the order calls end. With tens of calls in flight, most were decided while the
    breaker had no failures: their answers reset the count too, so a few failures among many answers (a burst of
    refused connections) no longer open the breaker and pause every item of the endpoint."""
    endpoint = "http://127.0.0.1:9/v1"
    guard = ProviderGuard(endpoint, store=store, sleep=FakeTime().sleep,
                          settings=OutageSettings(jitter=0.0, breaker_threshold=2, breaker_refresh=60.0))
    assert guard.call(lambda: "answered") == "answered" and store.providers.breakers() == []  # nothing written
    decided, release, answers = threading.Event(), threading.Event(), []

    def in_flight():
        decided.set()  # the breaker was read (closed, no failure) before this request left
        assert release.wait(30)
        return "answered"

    _fail_while_in_flight(store, guard, lambda: answers.append(guard.call(in_flight)), decided, release)
    assert answers == ["answered"]
    assert [row["consecutive_failures"] for row in store.providers.breakers()] == [0]  # its answer reset it
    guard.failed(ConnectionResetError("refused"), None)
    assert [(row["state"], row["consecutive_failures"]) for row in store.providers.breakers()] == [("closed", 1)]
    guard.failed(ConnectionResetError("refused"), None)  # two in a row: the threshold opens it
    assert [row["state"] for row in store.providers.breakers()] == ["open"]


def test_a_refusal_after_a_failure_resets_the_count_like_an_answer(store):
    """A refusal (a 4xx) is an answer: after a failure this guard counted, a refused call decided before that
    failure resets the count as an answered one does, and a half-open breaker's refused probe closes it."""
    import httpx

    endpoint = "http://127.0.0.1:9/v1"
    lines: list[str] = []
    guard = ProviderGuard(endpoint, store=store, sleep=FakeTime().sleep, log=lines.append,
                          settings=OutageSettings(jitter=0.0, breaker_threshold=2, breaker_refresh=60.0))
    assert guard.call(lambda: "answered") == "answered" and store.providers.breakers() == []
    request = httpx.Request("POST", endpoint)
    refusal = httpx.HTTPStatusError("bad request", request=request, response=httpx.Response(400, request=request))
    decided, release = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def refused():
        decided.set()  # the breaker was read (closed, no failure) before this request left
        assert release.wait(30)
        raise refusal

    def call() -> None:
        try:
            guard.call(refused)
        except Exception as exc:  # noqa: BLE001 - asserted below
            raised.append(exc)

    _fail_while_in_flight(store, guard, call, decided, release)
    assert len(raised) == 1 and classify(raised[0]).status_code == 400  # a refusal is not retried
    assert [row["consecutive_failures"] for row in store.providers.breakers()] == [0]  # the refusal reset it
    guard.failed(ConnectionResetError("refused"), None)
    assert [(row["state"], row["consecutive_failures"]) for row in store.providers.breakers()] == [("closed", 1)]


def test_a_refused_probe_closes_the_breaker(store):
    """A half-open breaker's probe that the provider refuses (a 4xx) was answered: the endpoint is up, so the
    breaker closes, and the log says the probe was answered."""
    import httpx

    endpoint = "http://127.0.0.1:9/v1"
    lines: list[str] = []
    guard = ProviderGuard(endpoint, store=store, sleep=FakeTime().sleep, log=lines.append,
                          settings=OutageSettings(jitter=0.0, breaker_threshold=1, breaker_cooldown=0.05))
    guard.failed(ConnectionResetError("refused"), None)
    assert [row["state"] for row in store.providers.breakers()] == ["open"]
    wait_for(lambda: _cooled_down(store, endpoint), timeout=30, interval=0.05, what="the breaker's cool-down")
    request = httpx.Request("POST", endpoint)

    def refused():
        raise httpx.HTTPStatusError("bad request", request=request, response=httpx.Response(400, request=request))

    with pytest.raises(httpx.HTTPStatusError):
        guard.call(refused)  # the probe: refused, not retried
    assert [row["state"] for row in store.providers.breakers()] == ["closed"]
    assert lines[-1] == f"circuit breaker for {endpoint} closed: the probe was answered"


def test_calls_that_fail_together_show_their_pause_once(store):
    """Eight calls of one node in flight fail together and pause together: one log line (and one pause shown on
    the pipeline) for each round, not one per call."""
    endpoint = "http://127.0.0.1:9/v1"
    lines: list[str] = []
    guard = ProviderGuard(endpoint, store=store, log=lines.append,
                          settings=OutageSettings(jitter=0.0, pause_after=1, pause_initial=1.0, pause_max=1.0,
                                                  breaker_threshold=1000))
    together = threading.Barrier(8)
    failures: dict[int, int] = {}

    def call(n: int) -> str:
        def attempt() -> str:
            failures[n] = failures.get(n, 0) + 1
            if failures[n] <= 2:
                together.wait(30)  # every call fails at the same moment, twice
                raise ConnectionResetError("refused")
            return "answered"
        return guard.call(attempt)

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, range(8))) == ["answered"] * 8
    waits = [line for line in lines if line.startswith("waiting 1.0 s:")]
    assert 2 <= len(waits) <= 4, waits  # a line per round (each call paused twice: 16 pauses)


def test_a_pause_ended_by_a_retry_is_shown_again_by_the_next_call_that_pauses(store):
    """Calls that pause together show their pause once; once a call's retry (or an answer) ends the pause shown, a
    call that pauses next shows it again, even within the first pause's time: the pipeline never says running
    while its calls wait."""
    from types import SimpleNamespace

    from recovery_ext._providers.guard import GuardedCall

    class Shown:
        def __init__(self) -> None:
            self.paused, self.shown = False, []

        def begin(self, seconds: float, reason: str) -> None:
            self.paused = True
            self.shown.append(seconds)

        def retrying(self) -> None:
            self.paused = False

        def end(self, *, outage_over: bool) -> None:
            self.paused = False

        def elapsed(self) -> float | None:
            return None

    fake, pause, lines = FakeTime(), Shown(), []
    guard = ProviderGuard("http://127.0.0.1:9/v1", store=store, pause=pause, clock=fake.clock, sleep=fake.sleep,
                          log=lines.append)

    def pauses(seconds: float) -> None:
        call = GuardedCall()
        call.pause_reason = "3 server_error errors in a row"
        guard._before_sleep(call)(SimpleNamespace(upcoming_sleep=seconds))

    pauses(60.0)
    pauses(60.0)  # a second call pausing with it: shown once
    assert pause.shown == [60.0] and len(lines) == 1
    fake.now += 5
    pause.retrying()  # one call asks again: the pause shown ends
    pauses(60.0)
    assert pause.shown == [60.0, 60.0] and len(lines) == 2
    # a call pausing while the first one still writes the pause it shows (a new user's trial: tasks that failed
    # together each logged it, up to 4 lines at once): shown once too
    pause.retrying()
    fake.now += 61
    writing, release = threading.Event(), threading.Event()
    real_begin = pause.begin

    def slow_begin(seconds: float, reason: str) -> None:
        writing.set()
        assert release.wait(10)
        real_begin(seconds, reason)

    pause.begin = slow_begin
    first = threading.Thread(target=pauses, args=(60.0,))
    first.start()
    assert writing.wait(10)
    pauses(60.0)
    release.set()
    first.join(10)
    assert pause.shown == [60.0, 60.0, 60.0] and len(lines) == 3, lines


def test_the_outage_clock_ends_only_while_no_pause_is_shown_and_only_for_its_owner(store):
    """``end_outage_clock``: a retried node that finished an item ends its pipeline's outage clock, but not while an
    outage pause is shown (a call still sleeps through the outage; a rate budget's wait does not count) and never
    for a superseded owner; what is shown is left as it is."""
    from dataclasses import replace

    from recovery_ext._errors import OwnershipLost

    own = store.pipelines.create_pipeline("j", [NodeSpec("n")], owner="run-a")
    assert store.providers.end_outage_clock(own, node="n") is False  # no outage: nothing to end
    store.providers.set_waiting(own, 60, "5 server_error errors in a row")
    assert store.providers.end_outage_clock(own, node="n") is False  # the pause is shown: the outage goes on
    shown = store.pipelines.get_pipeline(own.pipeline_id)
    assert shown.waiting_until is not None and shown.waiting_since is not None
    with pytest.raises(OwnershipLost):
        store.providers.end_outage_clock(replace(own, epoch=own.epoch + 1), node="n")
    assert store.providers.clear_waiting(own, node="n", keep_outage_clock=True, event="outage_retry")
    assert store.providers.waiting_seconds(own.pipeline_id) is not None  # the retry runs on the outage clock
    # another wait shown (a sibling waits for rate budget room) is no outage: it does not hold the clock
    assert store.providers.show_budget_wait(own, 30, "2 requests in flight", node="sibling")
    assert store.providers.end_outage_clock(own, node="n") is True
    assert store.providers.waiting_seconds(own.pipeline_id) is None
    assert store.pipelines.get_pipeline(own.pipeline_id).waiting_reason.startswith("rate budget")
    events = [t["event"] for t in store.reports.transitions_for(pipeline_id=own.pipeline_id, entity_type="pipeline")]
    assert events[-1] == "outage_over", events
