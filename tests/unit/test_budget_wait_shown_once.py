"""A node's calls waiting on the rate budget together show one wait: from the first call that waits to the last."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from recovery_ext._providers.budget import RateBudget
from recovery_ext._store.models import BudgetGrant, ProviderLimits


class Budgets:
    """``store.providers`` for a budget full until ``open`` is set: every reservation waits 0.3 s until then."""

    def __init__(self, callers: int) -> None:
        self.open = threading.Event()
        self.asked = threading.Barrier(callers)
        self.next_id = 0
        self.lock = threading.Lock()

    def budget_reserve(self, endpoint, model, *, tokens, limits, holder=None, own=None) -> BudgetGrant:
        if not self.open.is_set():
            return BudgetGrant(False, wait_seconds=0.3, requests_in_window=10, tokens_in_window=100)
        with self.lock:
            self.next_id += 1
            return BudgetGrant(True, self.next_id)


def test_calls_waiting_together_show_the_wait_once_and_the_last_one_ends_it():
    budgets = Budgets(callers=8)
    shown, ended, logged = [], [], []
    budget = RateBudget(SimpleNamespace(providers=budgets), "http://127.0.0.1:9/v1",
                        ProviderLimits(requests_per_minute=10), show_wait=lambda s, r: shown.append(r),
                        end_wait=lambda: ended.append(True), log=logged.append)
    reservations: list = []
    waiting = threading.Barrier(9)

    def call() -> None:
        steps = budget.acquire_steps(10)
        step = next(steps)  # its first reservation: refused, so it waits
        grant = step.fn(*step.args)
        step = steps.send(grant)
        while type(step).__name__ != "Sleep":  # the wait shown (by the first caller only)
            step = steps.send(step.fn(*step.args))
        waiting.wait(10)  # every caller is waiting now
        budgets.open.wait(10)
        try:
            step = steps.send(None)  # slept: ask again, granted
            step = steps.send(step.fn(*step.args))
            while True:  # the wait ended (by the last caller only)
                step = steps.send(step.fn(*step.args))
        except StopIteration as done:
            with budgets.lock:
                reservations.append(done.value)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    waiting.wait(10)
    assert len(shown) == 1 and "10 requests and 100 tokens" in shown[0] and len(logged) == 1
    assert ended == []  # nobody got room yet
    budgets.open.set()
    for t in threads:
        t.join(10)
    assert len(reservations) == 8
    assert ended == [True]  # once, by the last call to leave the wait
