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
    assert "its run worker stopped heartbeating for" in superseded_message(reclaimed)
