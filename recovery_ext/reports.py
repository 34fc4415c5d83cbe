"""Status and summary queries (seed 003's observability queries, seed 001's metrics)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, cast, func, select

from .database import Database
from .models import Pipeline, QueueItem
from .schema import events, node_items, nodes, pipelines, queue_items, transitions


class ReportOps(Database):
    def pipeline_summary(self) -> list[dict[str, Any]]:
        duration = self.dialect.seconds_between(pipelines.c.started_at, pipelines.c.completed_at)
        query = select(
            pipelines.c.status, func.count().label("count"), cast(func.avg(duration), Float).label("avg_seconds")
        ).group_by(pipelines.c.status).order_by(pipelines.c.status)
        with self.read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def queue_summary(self) -> list[dict[str, Any]]:
        duration = self.dialect.seconds_between(queue_items.c.started_at, queue_items.c.completed_at)
        query = select(
            queue_items.c.queue, queue_items.c.status, func.count().label("count"),
            cast(func.avg(duration), Float).label("avg_seconds"),
        ).group_by(queue_items.c.queue, queue_items.c.status).order_by(queue_items.c.queue, queue_items.c.status)
        with self.read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def recent_events(self, *, kinds: tuple[str, ...] | None = None, within_seconds: float | None = None,
                      after_id: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        query = select(events).where(events.c.id > after_id).order_by(events.c.id).limit(limit)
        if kinds:
            query = query.where(events.c.kind.in_(kinds))
        if within_seconds is not None:
            query = query.where(events.c.created_at >= self.dialect.now_plus(-float(within_seconds)))
        with self.read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def count_events(self, kind: str, *, within_seconds: float | None = None) -> int:
        query = select(func.count()).where(events.c.kind == kind)
        if within_seconds is not None:
            query = query.where(events.c.created_at >= self.dialect.now_plus(-float(within_seconds)))
        with self.read() as conn:
            return conn.scalar(query) or 0

    def transitions_for(self, *, pipeline_id: int | None = None, entity_type: str | None = None,
                        entity_id: int | None = None) -> list[dict[str, Any]]:
        query = select(transitions).order_by(transitions.c.id)
        if pipeline_id is not None:
            query = query.where(transitions.c.pipeline_id == pipeline_id)
        if entity_type is not None:
            query = query.where(transitions.c.entity_type == entity_type)
        if entity_id is not None:
            query = query.where(transitions.c.entity_id == entity_id)
        with self.read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def recent_failure_categories(self, pipeline_id: int, node_name: str, *, limit: int = 20) -> list[str | None]:
        """Error categories of a node's latest failures, newest first."""
        node_id = select(nodes.c.id).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == node_name)
        query = (select(transitions.c.data).where(transitions.c.entity_type == "node",
                                                  transitions.c.entity_id == node_id.scalar_subquery(),
                                                  transitions.c.to_status == "failed")
                 .order_by(transitions.c.id.desc()).limit(limit))
        with self.read() as conn:
            return [(d or {}).get("category") if isinstance(d, dict) else None for d in conn.scalars(query)]

    def list_pipelines(self, *, status: str | None = None, job_name: str | None = None,
                       limit: int = 50) -> list[Pipeline]:
        query = select(pipelines).order_by(pipelines.c.id.desc()).limit(limit)
        if status:
            query = query.where(pipelines.c.status == status)
        if job_name:
            query = query.where(pipelines.c.job_name == job_name)
        with self.read() as conn:
            return [Pipeline.from_row(r._mapping) for r in conn.execute(query)]

    def dead_items(self, *, limit: int = 100) -> list[QueueItem]:
        query = select(queue_items).where(queue_items.c.status == "dead").order_by(queue_items.c.id).limit(limit)
        with self.read() as conn:
            return [QueueItem.from_row(r._mapping) for r in conn.execute(query)]

    def node_item_totals(self, pipeline_id: int) -> dict[str, int]:
        query = (select(node_items.c.node_name, func.count()).where(node_items.c.pipeline_id == pipeline_id)
                 .group_by(node_items.c.node_name))
        with self.read() as conn:
            return {name: n for name, n in conn.execute(query)}

