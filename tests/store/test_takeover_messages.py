"""A take-over message quotes the heartbeat that expired: a node's when its step stopped, not the run's."""

from __future__ import annotations

import re

from sqlalchemy import update

from recovery_ext._recovery.protocol import superseded_message
from recovery_ext._store.models import PassPlan
from recovery_ext._store.models import PipelineBeat
from recovery_ext._store.schema import nodes
from helpers import reclaim


def test_a_node_heartbeat_take_over_quotes_the_nodes_silence_not_the_live_run_heartbeat(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a", heartbeat_timeout=60)
    with store.write() as conn:  # the step's last pulse was 40 s ago; its deadline passed 10 s ago
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == "a")
                     .values(heartbeat_at=store.dialect.now_plus(-40), heartbeat_deadline=store.dialect.now_plus(-10)))
    store.pipelines.pulse([PipelineBeat(own, 60)])  # while the run worker beats on
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert reclaimed.cause == "node_heartbeat"
    assert 39 <= reclaimed.heartbeat_age_seconds <= 60
    # the resume run words its take-over from what the reclaim recorded
    recorded = store.pipelines.last_reclaim(own.pipeline_id)
    assert recorded["cause"] == "node_heartbeat" and 39 <= recorded["heartbeat_age_seconds"] <= 60
    message = superseded_message(reclaimed)
    assert re.search(r"a step of it stopped heartbeating for (39|[45][0-9]|60) s while its run worker went on", message)


def test_a_run_heartbeat_take_over_quotes_the_runs_silence(store):
    from helpers import expire

    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a", heartbeat_timeout=600)
    with store.write() as conn:
        conn.execute(update(nodes).values(heartbeat_at=store.dialect.now_plus(-1)))
    expire(store, own.pipeline_id)
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert reclaimed.cause == "heartbeat"
    assert store.pipelines.last_reclaim(own.pipeline_id)["cause"] == "heartbeat"
    assert store.pipelines.last_reclaim(own.pipeline_id + 1) is None
    assert "its run worker stopped heartbeating for" in superseded_message(reclaimed)


def _stalled_with_run_pulse(store, pulse_ago: float, timeout: float = 10.0):
    """A running pipeline whose node's stall deadline passed, its run's last pulse ``pulse_ago`` s back and its run
    deadline ``timeout - pulse_ago`` s ahead (not expired: only the stall makes it an orphan)."""
    from recovery_ext._store.schema import pipelines

    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a", heartbeat_timeout=600, stall_timeout=5)
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id)
                     .values(stall_deadline=store.dialect.now_plus(-1)))
        conn.execute(update(pipelines).where(pipelines.c.id == own.pipeline_id)
                     .values(heartbeat_at=store.dialect.now_plus(-pulse_ago),
                             heartbeat_deadline=store.dialect.now_plus(timeout - pulse_ago)))
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert reclaimed.cause == "stalled"
    return reclaimed


def test_a_stalled_owner_that_still_pulses_is_heartbeating_so_the_take_over_may_terminate_it(store):
    assert _stalled_with_run_pulse(store, pulse_ago=1).owner_heartbeating is True


def test_a_stalled_owner_silent_for_more_than_half_its_timeout_is_not_heartbeating_though_its_deadline_holds(store):
    # frozen (SIGSTOP) after its last progress: the stall deadline passed before the heartbeat deadline; asking
    # such a worker to terminate would block the code server's launches, so the take-over must see it silent
    assert _stalled_with_run_pulse(store, pulse_ago=7).owner_heartbeating is False
