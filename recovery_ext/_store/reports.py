"""Status and summary queries (queue observability and recovery metrics) and the event outbox."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sqlalchemy import CompoundSelect, case, delete, func, literal, or_, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._settings import check_age
from recovery_ext._store import aggregates
from recovery_ext._store.database import Component, Database, retried
from recovery_ext._store.models import GAP_WINDOW, EventCursor, Pipeline, QueueItem
from recovery_ext._store.schema import (QUEUE_STATUSES, deleted_pipelines, events, node_items, nodes, pipeline_counts,
                                        pipelines, queue_counts, queue_items, transitions, waiting_shown)
from recovery_ext._store.statuses import UNFINISHED_QUEUE_STATUSES, NodeStatus, PipelineStatus, QueueStatus
from recovery_ext._store.ledger import LedgerOps
from recovery_ext._store.models import CostReport, MetricsSnapshot, PipelineHistory
from recovery_ext._store.observability import Observability
from recovery_ext._store.models import PruneResult
from recovery_ext._store.retention import Retention


# Beyond any pipeline id (ids are BIGINT): the open ends of the ranges no pipeline has.
_FAR = 2**62


class Reports(Component):
    """``store.reports`` (:class:`~recovery_ext._store.interfaces.ReportStore`): reads for the CLI, metrics and
    reports, the event log, and retention. The status and event queries are its own; its collaborators are
    attributes: ``ledger`` (the provider ledger's figures), ``observability`` (the exporter's snapshot and a
    pipeline's history) and ``retention`` (pruning finished pipelines)."""

    def __init__(self, db: Database, *, ledger: LedgerOps, observability: Observability,
                 retention: Retention) -> None:
        super().__init__(db)
        self.ledger = ledger
        self.observability = observability
        self.retention = retention

    # The collaborators' calls, named here so a caller sees the whole surface.

    def provider_costs(self, pipeline_id: int | None = None) -> CostReport:
        """:meth:`LedgerOps.provider_costs`."""
        return self.ledger.provider_costs(pipeline_id)

    def metrics_snapshot(self) -> MetricsSnapshot:
        """:meth:`Observability.metrics_snapshot`."""
        return self.observability.metrics_snapshot()

    def scrape_snapshot(self, *, timeout: float | None = None) -> MetricsSnapshot:
        """:meth:`Observability.scrape_snapshot`."""
        return self.observability.scrape_snapshot(timeout=timeout)

    def pipeline_history(self, pipeline_id: int) -> PipelineHistory:
        """:meth:`Observability.pipeline_history`."""
        return self.observability.pipeline_history(pipeline_id)

    def prune_finished_pipelines(self, older_than_seconds: float, *, batch_size: int | None = None,
                                 deployment: str | None = None, time_budget: float | None = None,
                                 max_batches: int | None = None, dry_run: bool = False,
                                 progress: Callable[[PruneResult], None] | None = None) -> PruneResult:
        """:meth:`Retention.prune_finished_pipelines`."""
        return self.retention.prune_finished_pipelines(
            older_than_seconds, batch_size=batch_size, deployment=deployment, time_budget=time_budget,
            max_batches=max_batches, dry_run=dry_run, progress=progress)

    # -- its own reads --------------------------------------------------------------------------

    @retried
    def pipeline_summary(self, *, deployment: str | None = None) -> list[dict[str, Any]]:
        """Pipelines by deployment and status, with their average duration (from the counts kept as they change)."""
        c = pipeline_counts.c
        where = () if deployment is None else (c.deployment == deployment,)
        with self.read() as conn:
            return aggregates.summary(conn, pipeline_counts, ("deployment", "status"), "pipelines", where)

    @retried
    def queue_summary(self) -> list[dict[str, Any]]:
        with self.read() as conn:
            return aggregates.summary(conn, queue_counts, ("queue", "status"), "items")

    @retried
    def recent_events(self, *, kinds: tuple[str, ...] | None = None, within_seconds: float | None = None,
                      after_id: int = 0, limit: int = 100, newest: bool = False) -> list[dict[str, Any]]:
        """Events in id order: the first ``limit`` after ``after_id``, or with ``newest`` the last ``limit``."""
        order = events.c.id.desc() if newest else events.c.id
        query = select(events).where(events.c.id > after_id).order_by(order).limit(limit)
        if kinds:
            query = query.where(events.c.kind.in_(kinds))
        if within_seconds is not None:
            query = query.where(events.c.created_at >= self.dialect.now_plus(-float(within_seconds)))
        with self.read() as conn:
            rows = [dict(r._mapping) for r in conn.execute(query)]
        return rows[::-1] if newest else rows

    @retried
    def follow_events(self, cursor: EventCursor, *, kinds: tuple[str, ...] | None = None,
                      limit: int = 1000) -> list[dict[str, Any]]:
        """Events committed since the last call, none skipped even when ids commit out of order.

        On PostgreSQL an id is taken at insert but visible only at commit, so id 7 can appear
        after id 8 was shown. Each id skipped over (a gap) is kept open and re-checked until
        every transaction that was running when the gap was seen has ended (the snapshot's
        ``xmin`` passed the ``xmax`` noted then, one poll later): by then the gap's row has
        committed (and is shown) or will never exist. SQLite commits in id order, so its
        gaps (rollbacks) close at once.
        """
        with self.read() as conn:
            xmin, xmax = self.dialect.snapshot_bounds(conn)
            found = [dict(r._mapping) for r in conn.execute(
                select(events).where(events.c.id > cursor.last_id).order_by(events.c.id).limit(limit))]
            if cursor.gaps:
                found += [dict(r._mapping) for r in conn.execute(
                    select(events).where(events.c.id.in_(sorted(cursor.gaps))))]
        found.sort(key=lambda e: e["id"])
        shown = cursor.advance([e["id"] for e in found], xmin=xmin, xmax=xmax)
        return [e for e in found if e["id"] in shown and (not kinds or e["kind"] in kinds)]

    @retried
    def start_following(self, *, kinds: tuple[str, ...] | None = None,
                        limit: int = 50) -> tuple[list[dict[str, Any]], EventCursor]:
        """The newest ``limit`` events and a cursor after them that still waits for ids in flight below."""
        with self.read() as conn:
            xmin, xmax = self.dialect.snapshot_bounds(conn)
            top = conn.scalar(select(func.max(events.c.id))) or 0
            visible = list(conn.scalars(select(events.c.id).where(events.c.id > top - GAP_WINDOW)))
            cursor = EventCursor(last_id=max(0, top - GAP_WINDOW))
            cursor.advance(visible, xmin=xmin, xmax=xmax)
            query = select(events).where(events.c.id <= top).order_by(events.c.id.desc()).limit(limit)
            if kinds:
                query = query.where(events.c.kind.in_(kinds))
            # A gap shows up later through follow_events, never twice.
            shown = [dict(r._mapping) for r in conn.execute(query) if r.id not in cursor.gaps]
        return shown[::-1], cursor

    @retried
    def prune_events(self, older_than_seconds: float, *, limit: int = 10_000) -> int:
        """Delete up to ``limit`` events older than the retention, oldest first. Returns how many."""
        older_than_seconds = check_age("older_than_seconds", older_than_seconds)
        cutoff = self.dialect.now_plus(-float(older_than_seconds))
        oldest = select(events.c.id).where(events.c.created_at < cutoff).order_by(events.c.id).limit(limit)
        with self.write() as conn:
            return conn.execute(delete(events).where(events.c.id.in_(oldest.scalar_subquery()))).rowcount or 0

    @retried
    def count_events(self, kind: str, *, within_seconds: float | None = None) -> int:
        query = select(func.count()).where(events.c.kind == kind)
        if within_seconds is not None:
            query = query.where(events.c.created_at >= self.dialect.now_plus(-float(within_seconds)))
        with self.read() as conn:
            return conn.scalar(query) or 0

    @retried
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

    @retried
    def recent_failure_categories(self, pipeline_id: int, node_name: str, *, limit: int = 20) -> list[str | None]:
        """Error categories of a node's latest failures, newest first."""
        node_id = select(nodes.c.id).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == node_name)
        query = (select(transitions.c.data).where(transitions.c.entity_type == "node",
                                                  transitions.c.entity_id == node_id.scalar_subquery(),
                                                  transitions.c.to_status == NodeStatus.FAILED)
                 .order_by(transitions.c.id.desc()).limit(limit))
        with self.read() as conn:
            return [(d or {}).get("category") if isinstance(d, dict) else None for d in conn.scalars(query)]

    @retried
    def list_pipelines(self, *, status: str | None = None, job_name: str | None = None,
                       limit: int = 50, deployment: str | None = None) -> list[Pipeline]:
        query = (select(pipelines, waiting_shown(self.dialect.now()).label("waiting_shown"))
                 .order_by(pipelines.c.id.desc()).limit(limit))
        if deployment is not None:
            query = query.where(pipelines.c.deployment == deployment)
        if status:
            query = query.where(pipelines.c.status == status)
        if job_name:
            query = query.where(pipelines.c.job_name == job_name)
        with self.read() as conn:
            return [Pipeline.from_row(r._mapping) for r in conn.execute(query)]

    @retried
    def unwatched_pipelines(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Running pipelines nothing can ever find dead: no heartbeat deadline and no hard deadline."""
        query = (select(pipelines.c.id, pipelines.c.job_name, pipelines.c.owner)
                 .where(pipelines.c.status == PipelineStatus.RUNNING, pipelines.c.heartbeat_deadline.is_(None),
                        pipelines.c.deadline.is_(None)).order_by(pipelines.c.id).limit(limit))
        with self.read() as conn:
            return [{**r._mapping, "reason": "running with no heartbeat deadline and no hard deadline"}
                    for r in conn.execute(query)]

    @retried
    def items_with_unknown_status(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Queue items whose status this version does not know: no claim or reset ever touches them."""
        query = (select(queue_items.c.id, queue_items.c.queue, queue_items.c.status)
                 .where(queue_items.c.status.not_in(QUEUE_STATUSES)).order_by(queue_items.c.id).limit(limit))
        with self.read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    @retried
    def items_with_bad_values(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Unfinished queue items whose times or counters no rule can use: a heartbeat deadline or retry
        time that is not a finite time never expires (or cannot be compared), so no claim, stale
        monitor or retry would ever move the item. Reported, not guessed at."""
        q = queue_items.c
        checks = [*[(self.dialect.bad_time(col), f"{col.name} is not a finite time")
                    for col in (q.heartbeat_deadline, q.available_at, q.started_at, q.created_at)],
                  *[(or_(col < 0, col >= 2**31 - 1), f"{col.name} out of range")
                    for col in (q.attempts, q.max_attempts)]]
        query = (select(q.id, q.queue, q.status, *[case((cond, literal(why)), else_=None).label(f"c{i}")
                                                      for i, (cond, why) in enumerate(checks)])
                 .where(q.status.in_(UNFINISHED_QUEUE_STATUSES), or_(*[cond for cond, _ in checks]))
                 .order_by(q.id).limit(limit))
        with self.read() as conn:
            return [{"id": r.id, "queue": r.queue, "status": r.status,
                     "reason": "; ".join(w for w in r[3:] if w)} for r in conn.execute(query)]

    @retried
    def dangling_rows(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Rows that point at a pipeline that is gone (written with foreign keys off, or by hand): nodes
        and item checkpoints nobody will read, and queue items held for a missing pipeline (the
        stale rule already frees those; listed so the operator sees where they came from).

        Looked for where such a pipeline can be, each through the rows' pipeline index: the ids in
        ``rx_deleted_pipelines`` that no pipeline has again (a delete of a pipeline that rows still point at notes
        its id there, by trigger, with the foreign keys off too: migration 0024), and the ranges below the first
        pipeline and beyond the last. As many lookups as such pipelines, however long the history: never a pass
        over the pipelines, their nodes or their items. Not found: rows written behind the foreign keys for an id
        between two pipelines whose delete noted nothing (an id never used, a pipeline deleted before those rows
        were written, or deleted with its table's triggers disabled).

        Each range is walked id by id (the next id in it, then the rows of that id, both through the index), not
        joined to the rows and grouped: PostgreSQL cannot know a range is empty, so it planned that join for a
        share of each table, and at a million pipelines the estimate passed ``jit_above_cost``: every `status`
        compiled the query (tens of ms) to read nothing. A walk's estimate is a few index probes at any size."""
        query = _dangling_rows_query().limit(limit)
        with self.read() as conn:
            return [{"kind": r[0], "pipeline_id": r[1], "rows": r[2],
                     "reason": f"pipeline {r[1]} does not exist"} for r in conn.execute(query)]

    @retried
    def dead_items(self, *, limit: int = 100) -> list[QueueItem]:
        query = (select(queue_items).where(queue_items.c.status == QueueStatus.DEAD)
                 .order_by(queue_items.c.id).limit(limit))
        with self.read() as conn:
            return [QueueItem.from_row(r._mapping) for r in conn.execute(query)]

    @retried
    def node_item_totals(self, pipeline_id: int) -> dict[str, int]:
        query = (select(node_items.c.node_name, func.count()).where(node_items.c.pipeline_id == pipeline_id)
                 .group_by(node_items.c.node_name))
        with self.read() as conn:
            return {name: n for name, n in conn.execute(query)}


@functools.cache
def _dangling_rows_query() -> CompoundSelect[Any]:
    """:meth:`Reports.dangling_rows`'s statement, without its limit: built once, as it is the same for every call
    (building its three walks costs more than running them on an intact database)."""
    noted = deleted_pipelines.c.id
    first = select(func.min(pipelines.c.id)).scalar_subquery()
    last = select(func.max(pipelines.c.id)).scalar_subquery()
    gaps = union_all(
        # between the first and the last (the ranges below cover the rest: no row is counted twice)
        select(noted.label("lo"), noted.label("hi"))
        .where(noted > first, noted < last, ~select(pipelines.c.id).where(pipelines.c.id == noted).exists()),
        select(literal(-_FAR).label("lo"), (func.coalesce(first, _FAR + 1) - 1).label("hi")),
        select((last + 1).label("lo"), literal(_FAR).label("hi")).where(last.isnot(None)),
    ).cte("gaps")  # read by all three walks: PostgreSQL computes it once

    def gone(kind: str, column: ColumnElement[Any], *rows: ColumnElement[bool]) -> Any:
        """(kind, pipeline id, rows) for each id in the gaps that ``column`` holds (of the rows ``rows``
        picks): a loose index scan, one probe for the next id and one count per id found."""
        def next_id(*within: ColumnElement[bool]) -> Any:
            return select(func.min(column)).where(*within, *rows).scalar_subquery()

        walk = select(gaps.c.hi, next_id(column.between(gaps.c.lo, gaps.c.hi)).label("id")) \
            .cte(f"walk_{kind}", recursive=True)
        walk = walk.union_all(select(walk.c.hi, next_id(column > walk.c.id, column <= walk.c.hi))
                              .where(walk.c.id.isnot(None)))
        counted = select(func.count()).where(column == walk.c.id, *rows).scalar_subquery()
        return select(literal(kind).label("kind"), walk.c.id, counted).where(walk.c.id.isnot(None))

    return union_all(
        gone("node", nodes.c.pipeline_id),
        gone("item_checkpoint", node_items.c.pipeline_id),
        gone("queue_item_holder", queue_items.c.holder_pipeline_id, queue_items.c.status == QueueStatus.PROCESSING),
    )
