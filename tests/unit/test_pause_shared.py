"""A node's calls share one pause on show: it ends when the last call sleeping through it tries again or ends, not at
the first attempt or answer of any call of the node (a trial, 64 calls in flight: each call's attempt cleared the
pause another was sleeping through, the next call to pause showed it again, 8 log lines and 9 events for one breaker
opening; and items slept 53 s through a pause nothing showed any more)."""

from __future__ import annotations

import threading

from recovery_ext._providers.guard import OutageSettings, ProviderGuard


class ShownPause:
    """A pause target that records what a guard shows (the pipeline row's ``waiting``, its end)."""

    def __init__(self) -> None:
        self.paused = False
        self.waiting = False
        self.shown: list[str] = []

    def begin(self, seconds: float, reason: str) -> None:
        self.shown.append("begin")
        self.paused = self.waiting = True

    def retrying(self) -> None:
        if self.paused:
            self.shown.append("retrying")
            self.paused = False

    def end(self, *, outage_over: bool) -> None:
        if self.waiting:
            self.shown.append("over" if outage_over else "budget spent")
            self.paused = self.waiting = False

    def elapsed(self) -> float | None:
        return None


def test_a_pause_stays_shown_while_a_call_sleeps_through_it_whatever_the_nodes_other_calls_do():
    asleep, wake = threading.Event(), threading.Event()

    def sleep(_seconds: float) -> None:  # only the pausing call sleeps: the test holds it asleep
        asleep.set()
        assert wake.wait(30)

    shown = ShownPause()
    guard = ProviderGuard("http://127.0.0.1:9/v1", pause=shown, sleep=sleep,
                          settings=OutageSettings(jitter=0.0, pause_after=1))
    tries: list[int] = []

    def fails_once() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionResetError("refused")
        return "answered"

    answers: list[str] = []
    pausing = threading.Thread(target=lambda: answers.append(guard.call(fails_once)))
    pausing.start()
    assert asleep.wait(30)
    assert shown.shown == ["begin"]
    # another call of the node starts its attempt and is answered while the first one sleeps through its pause
    assert guard.call(lambda: "other") == "other"
    assert shown.shown == ["begin"] and shown.paused
    wake.set()
    pausing.join(30)
    assert answers == ["answered"]
    assert shown.shown == ["begin", "retrying", "over"]  # the sleeper's retry, then its answer, end it


def test_calls_that_pause_together_show_one_pause_until_the_last_of_them_tries_again():
    sleeping = threading.Barrier(4)
    wake = threading.Event()

    def sleep(_seconds: float) -> None:
        sleeping.wait(30)
        assert wake.wait(30)

    shown = ShownPause()
    guard = ProviderGuard("http://127.0.0.1:9/v1", pause=shown, sleep=sleep,
                          settings=OutageSettings(jitter=0.0, pause_after=1))
    lock = threading.Lock()
    failed: set[str] = set()

    def fails_once(name: str) -> str:
        with lock:
            if name not in failed:
                failed.add(name)
                raise ConnectionResetError("refused")
        return name

    calls = [threading.Thread(target=guard.call, args=(fails_once, str(i))) for i in range(3)]
    for call in calls:
        call.start()
    sleeping.wait(30)  # all three asleep in their pause
    assert shown.shown == ["begin"]
    wake.set()
    for call in calls:
        call.join(30)
    assert shown.shown == ["begin", "retrying", "over"]


def test_a_call_stopped_before_its_pause_is_counted_never_holds_the_pause_open():
    """A review: a cancelled task's before_sleep may still run in its worker thread after the task has gone; had it
    counted the call then, nobody would count it off, and the pipeline would show `waiting` for ever. A call once
    stopped is never counted."""
    from tenacity import RetryCallState

    from recovery_ext._providers.guard import GuardedCall

    shown = ShownPause()
    guard = ProviderGuard("http://127.0.0.1:9/v1", pause=shown, sleep=lambda _: None,
                          settings=OutageSettings(jitter=0.0, pause_after=1))
    sleeper, stopped = GuardedCall(pause_reason="the breaker is open"), GuardedCall(pause_reason="the breaker is open")
    state = RetryCallState(None, None, (), {})
    state.upcoming_sleep = 30.0
    guard._before_sleep(sleeper)(state)
    guard.pause_stopped(stopped)  # the task was cancelled ...
    guard._before_sleep(stopped)(state)  # ... and its worker thread's before_sleep ran after
    guard.pause_retrying(sleeper)
    guard.pause_ended(sleeper)
    assert shown.shown == ["begin", "retrying", "over"]
