"""The ledger of provider work: every provider call a node makes, and what became of its answer.

One row per call in ``rx_provider_calls``: where it was made (pipeline, node, item, run, epoch),
the endpoint (redacted) and model, the tokens from the response's ``usage``, latency, outcome
and cost. ``reached_checkpoint`` is set in the transaction that checkpoints the item the call
answered (or completes the node it was made in), never after, so the reports can tell apart:

* **spent**: every call;
* **saved by resume**: calls a resume did not make again: their answers reached a checkpoint (or
  the call journal, and the resume replayed them into one) before the pipeline was taken over, in a
  node a later run went through again and skipped or replayed them. The calls of a node that
  finished before the crash were never at risk (the resume skips the node whole): kept, not saved.
  Defined once, by the view ``rx_calls_saved_by_resume`` (migration 0022), which the roll-ups of
  finished pipelines read too;
* **wasted**: calls whose answers never reached a checkpoint and never will: in flight at a
  crash, answered but retried, made by a worker that was superseded, or failed;
* **open**: answered calls of the live owner whose item is not checkpointed yet (neither), and its
  calls in flight;
* **replayed** (part of saved): calls whose answers the call journal handed to a later owner instead
  of a new call (see journal.py);
* **in flight, outcome unknown**: calls written before their request left (journaled calls) whose
  answer never arrived at a worker that still owns the pipeline: a kill, a revoke. The provider may
  have answered and charged; neither lost nor counted twice, and shown apart from wasted.

The row's id is made by the caller (:class:`ProviderCall`), so a call is written once whether
it is written at once, with its item's checkpoint, or late after the database came back.

Which rows the reports may sum (:func:`well_formed_call`): one corrupt row must never stop the figures of all
the others. A row written by this code always holds counts and a cost within bounds. A row written some other
way (an older release, a hand edit, SQLite's loose typing: an infinite or textual token count, a NaN cost) is
left out of every sum, counted (:func:`malformed_calls`), and the count is shown wherever the figures are
(``costs``, the metrics, the report), so nothing is silently lost.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, and_, case, func, literal, not_, or_, select
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._classify.redaction import redact
from recovery_ext._store.database import Component, chunks, retried
from recovery_ext._store.dialects import SQLITE_NOW
from recovery_ext._store.models import MAX_TOKENS, CostFigures, CostReport, ProviderCall
from recovery_ext._store.rolled_up import live_pipeline_ids
from recovery_ext._store.schema import calls_saved_by_resume, node_items, pipelines, provider_calls
from recovery_ext._store.statuses import PipelineStatus

pc = provider_calls.c

# Prices are at most one currency unit a token, so no well-formed call costs more than its tokens.
MAX_COST = float(2 * MAX_TOKENS)
MAX_LATENCY = 1e9  # seconds; a row's latency is not summed, but a listing of calls reads it back


def well_formed_call() -> ColumnElement[bool]:
    """True for a ledger row whose figures can be summed. On SQLite an infinite REAL or a TEXT value fails
    the BETWEEN (TEXT sorts above every number); on PostgreSQL NaN sorts above every number too."""
    return and_(pc.tokens_in.between(0, MAX_TOKENS), pc.tokens_out.between(0, MAX_TOKENS),
                or_(pc.cost.is_(None), pc.cost.between(0.0, MAX_COST)),
                pc.latency_seconds.between(0.0, MAX_LATENCY))


def malformed_calls(conn: Connection, pipeline_id: int | None = None) -> int:
    """How many ledger rows (of one pipeline) the sums leave out."""
    query = select(func.count()).select_from(provider_calls).where(not_(well_formed_call()))
    if pipeline_id is not None:
        query = query.where(pc.pipeline_id == pipeline_id)
    return int(conn.scalar(query) or 0)


SKIPPED_NOTE = "ledger row(s) left out of the figures: corrupt token counts or cost (e.g. infinite, negative, text)"

# The ledger outcome of a call whose request was sent (or about to be) and whose answer has not arrived.
IN_FLIGHT = "in_flight"

# The figures every report shows, in this order (the CLI's JSON keys).


@functools.lru_cache(maxsize=256)
def _redacted_endpoint(endpoint: str) -> str:
    return redact(endpoint)[:500]


def call_row(call: ProviderCall, *, reached: bool = False) -> dict[str, Any]:
    """The row of ``call`` (its endpoint redacted: a URL may carry a key or a password). ``reached``: the
    call's item (or node) is being checkpointed, so an answered call reached that checkpoint."""
    return {"id": call.id, "pipeline_id": call.pipeline_id, "node_name": call.node_name, "item_key": call.item_key,
            "run_id": call.run_id, "epoch": call.epoch, "endpoint": _redacted_endpoint(call.endpoint),
            "model": None if call.model is None else str(call.model)[:200], "tokens_in": call.tokens_in,
            "tokens_out": call.tokens_out, "latency_seconds": float(call.latency_seconds),
            "outcome": call.outcome if call.outcome == "ok" else redact(call.outcome)[:64],
            "cost": None if call.cost is None else float(call.cost),
            "reached_checkpoint": reached and call.outcome == "ok", "note": call.note}


_COLUMNS = ("id", "pipeline_id", "node_name", "item_key", "run_id", "epoch", "endpoint", "model", "tokens_in",
            "tokens_out", "latency_seconds", "outcome", "cost", "reached_checkpoint", "note")
_SQLITE_INSERT = (f"INSERT INTO rx_provider_calls ({', '.join(_COLUMNS)}, recorded_at) "
                  f"VALUES ({', '.join('?' for _ in _COLUMNS)}, {SQLITE_NOW}) ")
_SQLITE_RECORD = _SQLITE_INSERT + "ON CONFLICT (id) DO NOTHING"
_SQLITE_REACHED = _SQLITE_INSERT + "ON CONFLICT (id) DO UPDATE SET reached_checkpoint = excluded.reached_checkpoint"


class LedgerWrites(Component):
    """The ledger's writes and cost query, inside a caller's transaction: shared by the components that record
    or report provider calls."""

    def write_calls(self, conn: Connection, calls: Iterable[ProviderCall], *, reached: bool) -> None:
        """In the caller's transaction: insert ``calls``; with ``reached`` (the checkpoint of their item or node)
        the answered ones reached it, also those already written; a failed call never reaches one."""
        rows = [call_row(call, reached=reached) for call in calls]
        if not rows:
            return
        for row in rows:
            key = row["item_key"]
            if key is not None:  # a paid call is never refused, nor its batch (one bad key would keep all unwritten)
                row["item_key"] = self.dialect.storable_call_key(key)
        if self.dialect.ledger_rows_via_driver:
            # Fixed SQL on the driver's cursor, in this transaction: a checkpoint's one or two calls cost a
            # SQLAlchemy execute (~100 us) more than the rows themselves on SQLite.
            with self.driver_of(conn) as raw:
                raw.executemany(_SQLITE_REACHED if reached else _SQLITE_RECORD,
                                [tuple(r[c] for c in _COLUMNS) for r in rows])
            return
        stmt = self._calls_insert(reached)
        for part in chunks(rows, 500):
            conn.execute(stmt, list(part))

    def _calls_insert(self, reached: bool) -> Any:
        """The ledger's INSERT, built once per store (building it cost more than running it)."""
        key = f"_calls_insert_{reached}"
        built = self.__dict__.get(key)
        if built is None:
            stmt = self.dialect.insert(provider_calls).values(recorded_at=self.dialect.now())
            if reached:
                built = stmt.on_conflict_do_update(index_elements=[pc.id],
                                                   set_={"reached_checkpoint": stmt.excluded.reached_checkpoint})
            else:
                built = stmt.on_conflict_do_nothing(index_elements=[pc.id])
            self.__dict__[key] = built
        return built

    def costs_in(self, conn: Connection, pipeline_id: int | None = None, *, live_only: bool = False) -> CostReport:
        """:meth:`provider_costs` in the caller's transaction; ``live_only``: only the pipelines the roll-ups of
        finished work do not hold (aggregates.py), and no count of corrupt rows (the caller adds its own)."""
        p = pipelines.c
        item = node_items.c
        tokens = pc.tokens_in + pc.tokens_out
        cost = func.coalesce(pc.cost, 0.0)
        reached = pc.reached_checkpoint == True  # noqa: E712 - SQL, not Python
        # Skipped or replayed by a resume that went through its node again (the view of migration 0022).
        saved = calls_saved_by_resume.c.call_id.isnot(None)
        in_flight = pc.outcome == IN_FLIGHT
        live = and_(p.status == PipelineStatus.RUNNING, pc.epoch == p.epoch)
        # Neither kept nor lost yet: the live owner's answer whose item is not checkpointed yet, or its request
        # under way.
        open_ = and_(~reached, live, or_(and_(pc.outcome == "ok", item.item_key.is_(None)), in_flight))
        unknown = and_(in_flight, ~live)
        wasted = and_(~reached, ~open_, ~in_flight)
        replayed = and_(saved, pc.replays > 0)

        def total(condition: ColumnElement[bool], value: Any) -> ColumnElement[Any]:
            return func.coalesce(func.sum(case((condition, value), else_=literal(0))), 0)

        query = (
            select(pc.pipeline_id, pc.node_name.label("node"), func.max(p.job_name).label("job"),
                   func.count().label("calls"), func.coalesce(func.sum(pc.tokens_in), 0).label("tokens_in"),
                   func.coalesce(func.sum(pc.tokens_out), 0).label("tokens_out"),
                   func.coalesce(func.sum(cost), 0.0).label("cost"),
                   total(saved, 1).label("saved_calls"), total(saved, tokens).label("saved_tokens"),
                   total(saved, cost).label("saved_cost"),
                   total(wasted, 1).label("wasted_calls"), total(wasted, tokens).label("wasted_tokens"),
                   total(wasted, cost).label("wasted_cost"), total(replayed, 1).label("replayed_calls"),
                   total(unknown, 1).label("in_flight_unknown_calls"))
            .select_from(provider_calls
                         .outerjoin(pipelines, p.id == pc.pipeline_id)
                         .outerjoin(calls_saved_by_resume, calls_saved_by_resume.c.call_id == pc.id)
                         .outerjoin(node_items, and_(item.pipeline_id == pc.pipeline_id,
                                                     item.node_name == pc.node_name, item.item_key == pc.item_key)))
            .where(well_formed_call())
            .group_by(pc.pipeline_id, pc.node_name)
        )
        if pipeline_id is not None:
            query = query.where(pc.pipeline_id == pipeline_id)
        if live_only:
            query = query.where(pc.pipeline_id.in_(live_pipeline_ids()))
        rows = conn.execute(query).all()
        skipped = 0 if live_only else malformed_calls(conn, pipeline_id)
        report = CostReport(CostFigures(), {}, {}, {}, skipped_rows=skipped)
        for row in rows:
            figures = CostFigures.from_row(row._mapping)
            report.total.add(figures)
            if row.pipeline_id is None:
                continue
            report.pipelines.setdefault(row.pipeline_id, CostFigures()).add(figures)
            report.nodes.setdefault(row.pipeline_id, {})[row.node or ""] = figures
            report.jobs[row.pipeline_id] = row.job
        return report


class LedgerOps(LedgerWrites):
    # -- recording --------------------------------------------------------------------------------

    # -- reading ----------------------------------------------------------------------------------

    @retried
    def provider_costs(self, pipeline_id: int | None = None) -> CostReport:
        """Spent, saved by resume and wasted, per node and per pipeline (one pipeline, or all of them)."""
        with self.read() as conn:
            return self.costs_in(conn, pipeline_id)
