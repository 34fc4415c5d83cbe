"""Helpers shared by the tests."""

from __future__ import annotations

from recovery_ext.store import RecoveryStore


def expire(store: RecoveryStore, pipeline_id: int, *, column: str = "heartbeat_deadline", ago: float = 5.0) -> None:
    """Move a deadline into the past on the database clock (no sleeping)."""
    from sqlalchemy import update

    from recovery_ext.schema import pipelines

    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id)
                     .values({column: store.dialect.now_plus(-ago)}))
