"""A take-over (a re-execution or a Dagster run retry) starts without the dead run's outage, as a reclaim does:
not shown waiting with the dead run's reason, and its outage budget starts at its own first failure."""

from __future__ import annotations

import pytest

from helpers import expire
from outage_kit import FakeTime, answer, enricher, serve, store_guard

from recovery_ext._store.models import NodeSpec


def _paused_then_killed(store):
    own = store.pipelines.create_pipeline("job", [NodeSpec("n")], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "n")
    store.providers.set_waiting(own, 60, "5 server_error errors in a row from http://llm.local/v1")
    expire(store, own.pipeline_id, column="waiting_since", ago=200)  # an outage older than the budget below
    expire(store, own.pipeline_id)  # kill -9: the heartbeat stops
    return own


@pytest.mark.parametrize("owner_dead", [(), ("run-1",)], ids=["heartbeat expired", "dagster says failed"])
def test_a_takeover_resets_the_waiting_state_and_the_outage_clock(store, owner_dead):
    own = _paused_then_killed(store)
    again = store.pipelines.take_over(own.pipeline_id, "run-2", owner_dead=owner_dead)
    p = store.pipelines.get_pipeline(again.pipeline_id)
    assert (p.shown_status, p.waiting_until, p.waiting_since, p.waiting_reason) == ("running", None, None, None)
    assert store.providers.waiting_seconds(own.pipeline_id) is None


def test_the_new_runs_first_503_is_retried_not_given_up_on_the_dead_runs_outage(store, httpserver):
    own = _paused_then_killed(store)
    again = store.pipelines.take_over(own.pipeline_id, "run-2")
    store.pipelines.start_node(again, "n")
    seen = serve(httpserver, [answer(503), answer(200)])
    fake = FakeTime()

    build = store_guard(fake, store, again, pause_after=1, pause_initial=10, pause_max=60, budget_seconds=120)
    assert enricher(httpserver, guard_for=build).complete_json("glossary", {}) == {"ok": True}
    assert len(seen) == 2 and fake.slept == [10.0]  # one pause of its own, not "longer than the outage budget"
    assert store.pipelines.get_pipeline(own.pipeline_id).shown_status == "running"
