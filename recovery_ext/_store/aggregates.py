"""Figures that cost the same after a million finished pipelines as on the first day.

What grows with history is summed as the work happens, by triggers in the transaction of the write that
changes it (migration 0017): pipelines and queue items by label with their durations, the resume and
give-up counters, and, when a pipeline finishes, its item checkpoints and its ledger judged (per pipeline
and node, and per day and job), judged again when a ledger row of it lands or changes later (migration
0021). A reader adds the live pipelines' detail (found through the partial indexes on live statuses) to
those roll-ups, and never reads the finished pipelines' detail, which retention may prune: the roll-ups
have their own tables and survive it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, func, not_, null, select
from collections.abc import Sequence
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._store.models import COST_KEYS, CostFigures
from recovery_ext._store.ledger import well_formed_call
from recovery_ext._store.rolled_up import live_pipeline_ids
from recovery_ext._store.schema import (finished_items, ledger_daily, node_items, pipeline_counts, pipelines,
                                        provider_calls, queue_counts, resume_counts)

pc, p = provider_calls.c, pipelines.c

def pipeline_counts_by(conn: Connection, labels: dict[str, str]) -> list[tuple[tuple[Any, ...], int]]:
    """Pipelines by the ``labels`` (label -> rx_pipelines column), from the counts the triggers keep."""
    c = pipeline_counts.c
    columns = [c[column] for column in labels.values()]
    rows = conn.execute(select(*columns, func.sum(c.pipelines)).where(c.pipelines != 0)
                        .group_by(*columns).order_by(*columns))
    return [(tuple(r[:-1]), int(r[-1])) for r in rows]


def summary(conn: Connection, table: Table, keys: tuple[str, ...], counted: str,
            where: Sequence[ColumnElement[bool]] = ()) -> list[dict[str, Any]]:
    """Count and average duration per key, from a counts table (rx_pipeline_counts, rx_queue_counts)."""
    c = table.c
    rows = conn.execute(select(*[c[k] for k in keys], func.sum(c[counted]).label("count"),
                               func.sum(c.seconds_sum).label("seconds"), func.sum(c.seconds_count).label("timed"))
                        .where(c[counted] != 0, *where).group_by(*[c[k] for k in keys])
                        .order_by(*[c[k] for k in keys]))
    return [{**{k: r._mapping[k] for k in keys}, "count": int(r._mapping["count"]),
             "avg_seconds": float(r.seconds) / int(r.timed) if r.timed else None} for r in rows]


def resume_transitions(conn: Connection) -> list[tuple[str, str | None, int]]:
    """(event, cause or None, count) of the pipeline transitions the resume and give-up counters count."""
    c = resume_counts.c
    return [(r.event, r.cause or None, int(r.transitions))
            for r in conn.execute(select(c.event, c.cause, c.transitions).where(c.transitions != 0))]


def item_counts(conn: Connection) -> list[tuple[str, str, int]]:
    """(job, status, count) of item checkpoints: the finished pipelines' roll-up plus the live ones."""
    i, f = node_items.c, finished_items.c
    live = conn.execute(select(p.job_name, i.status, func.count())
                        .select_from(node_items.join(pipelines, p.id == i.pipeline_id))
                        .where(i.pipeline_id.in_(live_pipeline_ids())).group_by(p.job_name, i.status)).all()
    rolled = conn.execute(select(f.job_name, f.status, f["items"]).where(f["items"] != 0)).all()
    return _summed([*live, *rolled], 2)


def queue_item_counts(conn: Connection) -> list[tuple[str, str, int]]:
    c = queue_counts.c
    return [(r.queue, r.status, int(r[2])) for r in conn.execute(
        select(c.queue, c.status, c["items"]).where(c["items"] != 0).order_by(c.queue, c.status))]


def provider_spent(conn: Connection) -> list[tuple[Any, ...]]:
    """(job, model, outcome, calls, tokens in, tokens out, cost) of every well-formed ledger row: the finished
    pipelines' roll-up, the live pipelines' rows and the rows outside any pipeline."""
    d = ledger_daily.c
    figures = (func.count(), func.coalesce(func.sum(pc.tokens_in), 0), func.coalesce(func.sum(pc.tokens_out), 0),
               func.coalesce(func.sum(pc.cost), 0.0))
    live = conn.execute(select(p.job_name, pc.model, pc.outcome, *figures)
                        .select_from(provider_calls.join(pipelines, p.id == pc.pipeline_id))
                        .where(pc.pipeline_id.in_(live_pipeline_ids()), well_formed_call())
                        .group_by(p.job_name, pc.model, pc.outcome)).all()
    unowned = conn.execute(select(null(), pc.model, pc.outcome, *figures)
                           .where(pc.pipeline_id.is_(None), well_formed_call())
                           .group_by(pc.model, pc.outcome)).all()
    rolled = conn.execute(select(d.job_name, func.nullif(d.model, ""), d.outcome, func.sum(d.calls),
                                 func.sum(d.tokens_in), func.sum(d.tokens_out), func.sum(d.cost))
                          .where(d.calls != 0).group_by(d.job_name, d.model, d.outcome)).all()
    return _summed([*live, *unowned, *rolled], 3)


def rolled_up_costs(conn: Connection) -> tuple[dict[str, CostFigures], int]:
    """The finished pipelines' ledger figures per job, and how many of their rows were left out as corrupt."""
    d = ledger_daily.c
    keys = list(COST_KEYS)
    rows = conn.execute(select(d.job_name, *[func.sum(d[k]).label(k) for k in keys],
                               func.sum(d.skipped_rows).label("skipped_rows")).group_by(d.job_name)).all()
    by_job: dict[str, CostFigures] = {}
    skipped = 0
    for row in rows:
        figures: dict[str, Any] = {k: float(row._mapping[k]) if k.endswith("cost") else int(row._mapping[k])
                                   for k in keys}
        by_job[row.job_name] = CostFigures(**figures)
        skipped += int(row.skipped_rows or 0)
    return by_job, skipped


def live_malformed_calls(conn: Connection) -> int:
    """Corrupt ledger rows of live pipelines and outside any pipeline (the finished ones are rolled up)."""
    corrupt = not_(well_formed_call())
    return int(conn.scalar(select(func.count()).select_from(provider_calls)
                           .where(pc.pipeline_id.in_(live_pipeline_ids()), corrupt)) or 0) \
        + int(conn.scalar(select(func.count()).select_from(provider_calls)
                          .where(pc.pipeline_id.is_(None), corrupt)) or 0)


def _summed(rows: Iterable[tuple[Any, ...]], keys: int) -> list[tuple[Any, ...]]:
    """Rows with equal first ``keys`` values added up, in key order (None first)."""
    totals: dict[tuple[Any, ...], list[Any]] = {}
    for row in rows:
        key = tuple(row[:keys])
        into = totals.get(key)
        if into is None:
            totals[key] = list(row[keys:])
        else:
            for n, value in enumerate(row[keys:]):
                into[n] += value
    return [(*key, *values) for key, values in
            sorted(totals.items(), key=lambda kv: tuple("" if v is None else str(v) for v in kv[0]))]
