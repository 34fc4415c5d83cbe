"""Reads of the store's rows that tests assert on, and the one setup write no production path makes.

The store offers only what the library calls; a test that wants to see the ledger's rows, the journal's size
or an item's status reads the tables here, over the store's own connections.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sqlalchemy import func, select, update

from recovery_ext._classify.redaction import redact
from recovery_ext._store.budgets import _holding
from recovery_ext._store.database import chunks
from recovery_ext._store.ledger import well_formed_call
from recovery_ext._store.models import ProviderCall
from recovery_ext._store.schema import call_journal, node_items, nodes, pipelines, provider_calls as calls_table
from recovery_ext._store.schema import rate_budgets, rate_reservations
from recovery_ext._store.statuses import FINISHED_PIPELINE_STATUSES, NodeStatus, PipelineStatus
from recovery_ext._store.vouch import SlowNode

pc = calls_table.c


def provider_calls(store, pipeline_id: int | None = None) -> list[ProviderCall]:
    """The ledger's well-formed rows (of one pipeline), oldest first."""
    query = select(calls_table).where(well_formed_call()).order_by(pc.recorded_at, pc.id)
    if pipeline_id is not None:
        query = query.where(pc.pipeline_id == pipeline_id)
    with store.read() as conn:
        rows = conn.execute(query).all()
    names = {f.name for f in fields(ProviderCall)}
    return [ProviderCall(**{k: v for k, v in r._mapping.items() if k in names}) for r in rows]


def reached_checkpoint(store, call_ids) -> dict[str, bool]:
    """Whether each written call reached a checkpoint (calls not written are missing)."""
    found: dict[str, bool] = {}
    with store.read() as conn:
        for part in chunks(list(call_ids)):
            found.update({r.id: bool(r.reached_checkpoint) for r in conn.execute(
                select(pc.id, pc.reached_checkpoint).where(pc.id.in_(list(part))))})
    return found


def call_journal_size(store, pipeline_id: int | None = None) -> tuple[int, int]:
    """How many entries the journal holds (of one pipeline) and the characters of their answers."""
    jc = call_journal.c
    query = select(func.count(), func.coalesce(func.sum(func.length(jc.answer)), 0))
    if pipeline_id is not None:
        query = query.where(jc.pipeline_id == pipeline_id)
    with store.read() as conn:
        entries, chars = conn.execute(query).one()
    return int(entries), int(chars)


def item_statuses(store, pipeline_id: int, node_name: str) -> dict[str, str]:
    with store.read_statement() as conn:
        rows = conn.execute(select(node_items.c.item_key, node_items.c.status).where(
            node_items.c.pipeline_id == pipeline_id, node_items.c.node_name == node_name))
        return {r.item_key: r.status for r in rows}


def budgets(store) -> list[dict[str, Any]]:
    """Every budget with what its window holds now: requests and tokens reserved."""
    rr = rate_reservations.c
    with store.read() as conn:
        rows = conn.execute(select(rate_budgets).order_by(rate_budgets.c.endpoint, rate_budgets.c.model)).all()
        now = store.providers.budgets._clock(conn)
        result = []
        for row in rows:
            count, spent = conn.execute(select(func.count(), func.coalesce(func.sum(rr.tokens), 0)).where(
                rr.endpoint == row.endpoint, rr.model == row.model, _holding(now, row.window_seconds))).one()
            result.append({**dict(row._mapping), "requests_in_window": int(count), "tokens_in_window": int(spent)})
    return result


def slow_nodes(store) -> list[SlowNode]:
    """Running nodes past their own heartbeat deadline that their watcher still vouches for: slow, not dead."""
    n = nodes.c
    now = store.dialect.now()
    with store.read_statement() as conn:
        rows = conn.execute(
            select(n.pipeline_id, n.name, n.process, n.heartbeat_deadline, n.vouched_until)
            .where(n.status == NodeStatus.RUNNING, n.heartbeat_deadline < now, n.vouched_until >= now,
                   n.died_at.is_(None))
            .order_by(n.pipeline_id, n.name))
        return [SlowNode(*r) for r in rows]


def fail_pipeline(store, pipeline_id: int, reason: str) -> bool:
    """A live pipeline becomes failed behind its owner's back, as an operator's SQL would do it: the
    setup of tests where the owner finds its pipeline finished under it."""
    with store.write() as conn:
        row = conn.execute(
            update(pipelines)
            .where(pipelines.c.id == pipeline_id, pipelines.c.status.not_in(FINISHED_PIPELINE_STATUSES))
            .values(status=PipelineStatus.FAILED, gave_up_reason=redact(reason), completed_at=store.dialect.now(),
                    updated_at=store.dialect.now(), heartbeat_deadline=None)
            .returning(pipelines.c.id)
        ).first()
        if row is None:
            return False
        store.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": pipeline_id,
                                         "pipeline_id": pipeline_id, "from_status": None,
                                         "to_status": PipelineStatus.FAILED,
                                         "event": "failed_by_operator", "data": {"reason": redact(reason)}}])
        store.record_events(conn, [{"kind": "pipeline_stuck", "pipeline_id": pipeline_id,
                                    "payload": {"reason": redact(reason)}}])
    return True


def roll_up_finished(store, lo: int, hi: int) -> None:
    """Add the finished pipelines with ids ``lo``..``hi`` written in bulk (not finished through the store) to
    the roll-ups; a pipeline that finishes through the store is rolled up by its own transaction."""
    with store.write() as conn:
        store.dialect.roll_up_finished(conn, lo, hi)


def replays_by_item(store, pipeline_id: int, node_name: str) -> dict[str | None, int]:
    """How many times the journal gave back each item's paid answers instead of asking again."""
    query = (select(pc.item_key, func.sum(pc.replays)).where(pc.pipeline_id == pipeline_id, pc.node_name == node_name)
             .group_by(pc.item_key))
    with store.read() as conn:
        return {key: int(n) for key, n in conn.execute(query).all() if n}
