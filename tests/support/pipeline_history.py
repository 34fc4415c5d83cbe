"""What happened to a pipeline, for an e2e test's failure message (a failed assertion says why, not only what)."""

from __future__ import annotations

from sqlalchemy import select

from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.schema import transitions


def history(dev, store, pipeline_id: int) -> str:
    """What happened to a pipeline, for a failure message: its moves, its nodes now, and its runs."""
    with store.read() as conn:
        moves = conn.execute(select(transitions.c.entity_type, transitions.c.entity_id, transitions.c.from_status,
                                    transitions.c.to_status, transitions.c.event, transitions.c.data)
                             .where(transitions.c.pipeline_id == pipeline_id).order_by(transitions.c.id)).all()
    nodes_now = [(n.name, n.status, n.died_at, n.vouched_until, n.heartbeat_deadline)
                 for n in store.pipelines.list_nodes(pipeline_id)]
    runs = [(r.run_id, r.status.value, r.tags.get(TAG_RESUME_NUMBER)) for r in dev.runs()
            if r.tags.get(TAG_PIPELINE) == str(pipeline_id)]
    return (f"pipeline {store.pipelines.get_pipeline(pipeline_id)}; moves {[tuple(m) for m in moves]}; "
            f"nodes {nodes_now}; runs {runs}")
