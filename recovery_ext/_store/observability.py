"""Reads for the metrics exporter and the pipeline report: aggregates at one moment, one pipeline's history.

Nothing here keeps state between calls: every figure is recomputed from the application tables,
so any number of exporters can read the same database. Counters come from ``rx_transitions``,
which nothing prunes (``rx_events`` expire after the retention), so they only grow.
"""

from __future__ import annotations

import datetime as dt
from contextlib import nullcontext
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Float, Select, Text, and_, case, cast, func, literal, or_, select

from recovery_ext._store import aggregates
from recovery_ext._store.database import Component, Database, retried
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.statuses import PipelineStatus, QueueStatus
from recovery_ext._store.ledger import well_formed_call
from recovery_ext._store.models import CostFigures, MetricsSnapshot, Node, Pipeline, PipelineHistory
from recovery_ext._errors import NotFound
from recovery_ext._store.schema import (calls_saved_by_resume, circuit_breakers, events, node_items, nodes,
                                        pipelines, provider_calls, queue_items, spend_caps, transitions,
                                        waiting_shown)
from recovery_ext._store.ledger import LedgerOps
from recovery_ext._store.models import CapState, deployment_scope, pipeline_scope
from recovery_ext._store.models import wait_kind

# Pipeline columns that label the pipeline gauges: Prometheus label -> column, one entry per label (not
# "job" or "instance": Prometheus sets those on every target).
PIPELINE_LABELS: dict[str, str] = {"deployment": "deployment", "dagster_job": "job_name", "status": "status"}

# Pipeline transitions that hand a pipeline to a new run with a new epoch, and the cause each one reports
# (a reclaim carries its own cause: heartbeat, node_heartbeat, node_died, owner_run_dead, deadline, stalled).
# The report draws item progress from at most this many checkpoint times (a curve, not a list).
ITEM_TIMES_LIMIT = 50_000

RESUME_EVENTS: dict[str, str | None] = {"reclaimed": None, "taken_over": "re_execution",
                                        "reopened_for_degraded": "redo_degraded"}
# Every cause a reclaim reports (the recovery scan's reason), and so every cause of a resume run: the exporter
# shows each one from the start, 0 until it happens.
RECLAIM_CAUSES: tuple[str, ...] = ("heartbeat", "node_heartbeat", "node_died", "owner_run_dead", "deadline", "stalled")
RESUME_CAUSES: tuple[str, ...] = (*RECLAIM_CAUSES, *(c for c in RESUME_EVENTS.values() if c))
# Every pipeline transition a Prometheus counter counts: a prune keeps these (a counter never goes backwards).
COUNTED_TRANSITION_EVENTS: tuple[str, ...] = (*RESUME_EVENTS, "given_up")


class Observability(Component):
    """The metrics exporter's and the pipeline report's reads; the ledger's figures come from ``ledger``."""

    def __init__(self, db: Database, *, ledger: LedgerOps) -> None:
        super().__init__(db)
        self.ledger = ledger

    @retried
    def metrics_snapshot(self) -> MetricsSnapshot:
        return self.scrape_snapshot()

    def scrape_snapshot(self, *, timeout: float | None = None) -> MetricsSnapshot:
        """The snapshot in one transaction, not retried; with ``timeout`` no statement and no lock wait lasts
        longer (a scrape answers before Prometheus gives up on it, database down or not)."""
        p = pipelines.c
        now = self.dialect.now()
        with self.read() as conn, (self.dialect.bounded(conn, timeout) if timeout else nullcontext()):
            by_labels = aggregates.pipeline_counts_by(conn, PIPELINE_LABELS)
            waiting = conn.execute(select(p.job_name, p.waiting_reason).where(waiting_shown(now))).all()
            caps = [CapState.from_row(r) for r in conn.execute(
                select(spend_caps).where(or_(spend_caps.c.scope.startswith("deployment:"), spend_caps.c.scope.in_(
                    select(literal("pipeline:") + cast(p.id, Text)).where(p.status == PipelineStatus.RUNNING))))
                .order_by(spend_caps.c.scope))]
            expired = conn.execute(
                select(p.job_name, func.count()).where(p.status == PipelineStatus.RUNNING, p.heartbeat_deadline < now)
                .group_by(p.job_name).order_by(p.job_name)).all()
            oldest = conn.scalar(
                select(cast(func.max(self.dialect.seconds_between(p.heartbeat_at, now)), Float))
                .where(p.status == PipelineStatus.RUNNING, p.heartbeat_at.isnot(None)))
            counted = aggregates.resume_transitions(conn)
            items = aggregates.item_counts(conn)
            queued = aggregates.queue_item_counts(conn)
            breakers = [dict(r._mapping) for r in conn.execute(
                select(circuit_breakers.c.endpoint, circuit_breakers.c.state,
                       circuit_breakers.c.consecutive_failures, circuit_breakers.c.open_count)
                .order_by(circuit_breakers.c.endpoint))]
            spent = aggregates.provider_spent(conn)
            by_job_figures, skipped = aggregates.rolled_up_costs(conn)
            live = self.ledger.costs_in(conn, live_only=True)
            skipped += aggregates.live_malformed_calls(conn)
        for pipeline_id, figures in live.pipelines.items():
            by_job_figures.setdefault(live.jobs.get(pipeline_id) or "", CostFigures()).add(figures)
        by_job = {job: figures.as_dict() for job, figures in by_job_figures.items()}
        reclaims: dict[str, int] = {}
        resumes: dict[str, int] = {}
        given_up = 0
        for event, why, n in counted:
            if event == "given_up":
                given_up += n
                continue
            why = RESUME_EVENTS[event] or why or "unknown"
            resumes[why] = resumes.get(why, 0) + n
            if event == "reclaimed":
                reclaims[why] = reclaims.get(why, 0) + n
        return MetricsSnapshot(
            pipeline_labels=tuple(PIPELINE_LABELS), pipelines=by_labels,
            waiting_pipelines=_waiting_by_kind(waiting), expired_pipelines=[tuple(r) for r in expired],
            oldest_heartbeat_age_seconds=None if oldest is None else max(0.0, float(oldest)),
            reclaims=sorted(reclaims.items()), resume_runs=sorted(resumes.items()), given_up=given_up,
            items=items, queue_items=queued, breakers=breakers,
            provider_calls=spent, provider_costs=by_job, skipped_ledger_rows=skipped, spend_caps=caps)

    @retried
    def pipeline_history(self, pipeline_id: int) -> PipelineHistory:
        """The pipeline, its nodes, transitions, events and item checkpoints per run, in one snapshot."""
        ni = node_items.c
        with self.read() as conn:
            row = conn.execute(select(pipelines, waiting_shown(self.dialect.now()).label("waiting_shown"))
                               .where(pipelines.c.id == pipeline_id)).first()
            if row is None:
                raise NotFound(f"no pipeline {pipeline_id}")
            node_rows = [Node.from_row(r._mapping) for r in conn.execute(
                select(nodes).where(nodes.c.pipeline_id == pipeline_id).order_by(nodes.c.position))]
            caps = [CapState.from_row(r) for r in conn.execute(select(spend_caps).where(spend_caps.c.scope.in_(
                [pipeline_scope(pipeline_id), deployment_scope(row.deployment or "")])).order_by(spend_caps.c.scope))]
            history = [dict(r._mapping) for r in conn.execute(
                select(transitions).where(transitions.c.pipeline_id == pipeline_id).order_by(transitions.c.id))]
            happened = [dict(r._mapping) for r in conn.execute(
                select(events).where(events.c.pipeline_id == pipeline_id).order_by(events.c.id))]
            items = [dict(r._mapping) for r in conn.execute(
                select(ni.epoch, ni.run_id, ni.node_name.label("node"), ni.status, func.count().label("count"),
                       func.min(ni.completed_at).label("first_at"), func.max(ni.completed_at).label("last_at"))
                .where(ni.pipeline_id == pipeline_id)
                .group_by(ni.epoch, ni.run_id, ni.node_name, ni.status)
                .order_by(ni.epoch, ni.node_name, ni.status))]
            item_count = conn.scalar(select(func.count()).select_from(node_items)
                                     .where(ni.pipeline_id == pipeline_id)) or 0
            item_step = _step(item_count)
            item_times = [tuple(r) for r in conn.execute(_every(
                select(ni.epoch, ni.completed_at).where(ni.pipeline_id == pipeline_id),
                (ni.completed_at, ni.node_name, ni.item_key), item_step, item_count))]
            # A queue node (OCR) checkpoints its documents as work queue items, each completed under the
            # epoch that held it: the items of that run, as the checkpoints of an items() loop are.
            qi = queue_items.c
            done = and_(qi.holder_pipeline_id == pipeline_id, qi.status == QueueStatus.COMPLETED)
            items += [{**r._mapping, "node": f"queue {r.node}", "run_id": None} for r in conn.execute(
                select(qi.holder_epoch.label("epoch"), qi.queue.label("node"), qi.status, func.count().label("count"),
                       func.min(qi.completed_at).label("first_at"), func.max(qi.completed_at).label("last_at"))
                .where(done).group_by(qi.holder_epoch, qi.queue, qi.status).order_by(qi.holder_epoch, qi.queue))]
            item_times = sorted(item_times + [tuple(r) for r in conn.execute(
                select(qi.holder_epoch, qi.completed_at).where(done)
                .order_by(qi.completed_at).limit(ITEM_TIMES_LIMIT)) if r[1] is not None],
                key=lambda t: t[1])[:ITEM_TIMES_LIMIT]
            now = conn.execute(select(self.dialect.now().label("now"))).scalar_one()
        if not isinstance(now, dt.datetime):  # SQLite's clock is epoch seconds
            now = dt.datetime.fromtimestamp(float(now), tz=dt.UTC)
        calls, call_count, calls_step, call_figures = self._calls_of(pipeline_id)
        report = self.ledger.provider_costs(pipeline_id)
        costs = report.pipelines.get(pipeline_id)
        return PipelineHistory(Pipeline.from_row(row._mapping), node_rows, history, happened, items, item_times, now,
                               calls=calls, costs={**(costs.as_dict() if costs is not None else {}),
                                                   "skipped_rows": report.skipped_rows},
                               item_count=item_count, item_times_step=item_step, call_count=call_count,
                               calls_step=calls_step, call_figures=call_figures, spend_caps=caps)

    def _calls_of(self, pipeline_id: int) -> tuple[list[dict[str, Any]], int, int, list[dict[str, Any]]]:
        """The pipeline's provider calls with their fate, as the ledger's cost report judges it (every step-th
        past ITEM_TIMES_LIMIT), their count and step, and their figures per run and fate (all of them)."""
        pc, p, item = provider_calls.c, pipelines.c, node_items.c
        reached = pc.reached_checkpoint == True  # noqa: E712 - SQL, not Python
        in_flight = pc.outcome == IN_FLIGHT
        open_ = and_(~reached, p.status == PipelineStatus.RUNNING, pc.epoch == p.epoch,
                     or_(and_(pc.outcome == "ok", item.item_key.is_(None)), in_flight))
        saved = calls_saved_by_resume.c.call_id.isnot(None)  # the ledger's one definition (migration 0022)
        fate = case((saved, literal("saved")), (reached, literal("kept")),
                    (open_, literal("unsettled")), (in_flight, literal("in_flight")), else_=literal("wasted"))
        joined = (provider_calls.join(pipelines, p.id == pc.pipeline_id)
                  .outerjoin(calls_saved_by_resume, calls_saved_by_resume.c.call_id == pc.id)
                  .outerjoin(node_items, and_(item.pipeline_id == pc.pipeline_id, item.node_name == pc.node_name,
                                              item.item_key == pc.item_key)))
        mine = and_(pc.pipeline_id == pipeline_id, well_formed_call())
        tokens = (pc.tokens_in + pc.tokens_out).label("tokens")
        with self.read() as conn:
            count = conn.scalar(select(func.count()).select_from(provider_calls).where(mine)) or 0
            step = _step(count)
            calls = [dict(r._mapping) for r in conn.execute(_every(
                select(pc.epoch, pc.recorded_at, pc.node_name, pc.outcome, tokens, pc.cost, fate.label("fate"))
                .select_from(joined).where(mine), (pc.recorded_at, pc.id), step, count))]
            figures = [dict(r._mapping) for r in conn.execute(
                select(pc.epoch, fate.label("fate"), func.count().label("calls"),
                       func.coalesce(func.sum(pc.tokens_in + pc.tokens_out), 0).label("tokens"),
                       func.coalesce(func.sum(pc.cost), 0.0).label("cost"))
                .select_from(joined).where(mine).group_by(pc.epoch, fate))]
        return calls, count, step, figures


def _step(count: int) -> int:
    """Take every step-th row so that at most ITEM_TIMES_LIMIT of ``count`` are drawn."""
    return max(1, -(-count // ITEM_TIMES_LIMIT))


def _every(query: Select[Any], order: Any, step: int, count: int) -> Select[Any]:
    """``query``'s rows in ``order``, every ``step``-th of them and the last: the whole span, not its start."""
    if step == 1:
        return query.order_by(*order)
    numbered = query.add_columns(func.row_number().over(order_by=order).label("rx_n")).subquery()
    kept = [c for c in numbered.c if c.name != "rx_n"]
    return (select(*kept).where((numbered.c.rx_n % step == 0) | (numbered.c.rx_n == count))
            .order_by(numbered.c.rx_n))


def _waiting_by_kind(rows: Iterable[Any]) -> list[tuple[str, str, int]]:
    """(job, what it waits on, count) of the waiting pipelines' (job, reason) rows."""
    counts: dict[tuple[str, str], int] = {}
    for job, reason in rows:
        key = (job, wait_kind(reason).value)
        counts[key] = counts.get(key, 0) + 1
    return [(job, kind, n) for (job, kind), n in sorted(counts.items())]
