"""A superseded run's ``recovery/superseded_cause`` tag: the reclaim's cause, with how long a heartbeat had been
silent only when that silence was the cause."""

from __future__ import annotations

import pytest

from recovery_ext._dagster.executor import superseded_cause


@pytest.mark.parametrize(("reclaim", "tag"), [
    ({"cause": "heartbeat", "heartbeat_age_seconds": 95.04}, "heartbeat, heartbeat silent for 95.0 s"),
    ({"cause": "node_heartbeat", "heartbeat_age_seconds": 12}, "node_heartbeat, node heartbeat silent for 12.0 s"),
    # Dagster reported the run dead 15 s after its last heartbeat (every 30 s): the silence explains nothing
    ({"cause": "owner_run_dead", "heartbeat_age_seconds": 15.2}, "owner_run_dead"),
    ({"cause": "stalled", "heartbeat_age_seconds": 3.0}, "stalled"),
    ({"cause": "deadline", "heartbeat_age_seconds": 3.0}, "deadline"),
    ({"cause": "node_died"}, "node_died"),
    ({"cause": "heartbeat", "heartbeat_age_seconds": None}, "heartbeat"),
    ({"cause": "heartbeat", "heartbeat_age_seconds": "95"}, "heartbeat"),  # a corrupt record: no number shown
    ({}, "orphaned"),
])
def test_the_superseded_cause_names_a_silence_only_when_it_was_the_cause(reclaim, tag):
    assert superseded_cause(reclaim) == tag
