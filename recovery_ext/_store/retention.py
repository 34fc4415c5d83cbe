"""Retention: deleting the history of pipelines that finished long ago, in small batches beside live writers.

A pipeline is prunable once its status is completed or failed, the statuses whose figures the roll-ups of
finished work hold (a canceled pipeline is read live by the cost counters, so its detail stays), and it ended
(``completed_at``) before the cut-off, ``now - older_than`` on the database clock. Pending and
running pipelines (waiting, orphaned, awaiting their resume run) are never candidates, whatever
their age, nor is the newest pipeline (its id stays taken: SQLite would hand it out again). A finished
pipeline without an end time (rows older versions wrote) is aged by its ``updated_at`` instead, and counted
apart (:attr:`PruneResult.no_end_time`) so an operator sees them.

One batch is one short write transaction: it locks up to ``batch_size`` candidates
``FOR UPDATE SKIP LOCKED`` (SQLite: its single writer lock, ``BEGIN IMMEDIATE``), deletes
their rows table by table as :data:`PRUNE_STEPS` lists them, then the pipelines. Live writers
never wait on it for more than one batch: they lock only live pipelines' rows, which a batch
never touches, and a re-execution that takes a finished pipeline over locks the same pipeline
row, so either it waits for the batch (and then finds no pipeline) or the batch skips that row.

Kept on purpose: every table whose name says ``total`` or ``aggregate`` (costs over time per
pipeline and per day outlive the detail), and the pipeline transitions the Prometheus counters
count (reclaims, resume runs, given up), so a counter never goes backwards after a prune.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from typing import Any

from sqlalchemy import ColumnElement, Connection, Table, and_, delete, func, literal_column, not_, or_, select, update

from recovery_ext._settings import check_age
from recovery_ext._store.database import Component, retried
from recovery_ext._store.observability import COUNTED_TRANSITION_EVENTS
from recovery_ext._store.schema import (call_journal, events, node_items, nodes, pipelines, provider_calls,
                                        provider_jobs, queue_items, rate_reservations, spend_caps, spend_reservations,
                                        transitions)
from recovery_ext._store.rolled_up import ROLLED_UP
from recovery_ext._store.models import PruneResult, pipeline_scope
from recovery_ext._store.statuses import QueueStatus

p, t, q = pipelines.c, transitions.c, queue_items.c

@dataclass(frozen=True)
class PruneStep:
    """One table of a pipeline's history, and which of its rows belong to a batch of pipelines.

    ``kept_as``: rows that ``identity`` selects are not deleted but updated to these values (a compact record of
    what was done, with nothing left pointing at the pipeline), before the rest is deleted; with ``deletes``
    False every row is kept so."""

    table: Table
    rows_of: Callable[[Sequence[int]], ColumnElement[Any]]
    identity: ColumnElement[Any] | None = None
    kept_as: dict[str, Any] = field(default_factory=dict)
    deletes: bool = True

    def apply(self, conn: Connection, ids: Sequence[int]) -> tuple[int, int]:
        """(rows deleted, rows compacted) of this table for a batch of pipelines."""
        compacted = 0
        if self.kept_as:
            kept = self.rows_of(ids) if self.identity is None else and_(self.rows_of(ids), self.identity)
            compacted = conn.execute(update(self.table).where(kept).values(**self.kept_as)).rowcount or 0
        if not self.deletes:
            return 0, compacted
        return conn.execute(delete(self.table).where(self.rows_of(ids))).rowcount or 0, compacted


def _by_pipeline(table: Table) -> PruneStep:
    return PruneStep(table, lambda ids: table.c.pipeline_id.in_(ids))


def _queue_items_of(ids: Sequence[int]) -> ColumnElement[Any]:
    """Completed queue items a batch's pipelines held. Found through their transitions (every claim records one
    with its pipeline, and ``rx_transitions_pipeline`` indexes them), since only processing items have an index
    on their holder. Ready and processing items are live work whoever held them last: they stay."""
    # Not narrowed to queue-item transitions: that would lure SQLite onto rx_transitions_entity (every queue item's
    # transitions). A node's id among the candidates is harmless: only items the batch's pipelines held match.
    claimed = select(t.entity_id).where(t.pipeline_id.in_(ids))
    # Completed items only: a dead or failed item keeps its row and payload for `retry-dead`, however old.
    completed = q.status == literal_column(f"'{QueueStatus.COMPLETED}'")
    return and_(q.id.in_(claimed), q.holder_pipeline_id.in_(ids), completed)


def _uncounted_transitions_of(ids: Sequence[int]) -> ColumnElement[Any]:
    counted = and_(t.entity_type == "pipeline", t.event.in_(COUNTED_TRANSITION_EVENTS))
    return and_(t.pipeline_id.in_(ids), not_(counted))


#: What a prune deletes for each batch of pipelines, in this order, before the pipelines themselves: a row found
#: through another table goes before that table (queue items through transitions). One line adds or keeps a table.
#: A completed queue item with a dedupe key stays, compact: the queue's dedupe is what keeps a rescan of the same
#: documents from processing and paying for them again, so retention must never make that done work look undone.
PRUNE_STEPS: tuple[PruneStep, ...] = (
    PruneStep(queue_items, _queue_items_of, identity=q.dedupe_key.isnot(None),
              kept_as={"payload": {}, "result": None, "worker": None, "last_error": None, "last_error_at": None,
                       "heartbeat_deadline": None, "holder_pipeline_id": None, "holder_epoch": None}),
    _by_pipeline(node_items),
    _by_pipeline(call_journal),
    _by_pipeline(provider_jobs),
    _by_pipeline(provider_calls),  # the ledger's detail; per-pipeline and per-day totals stay
    # a finished pipeline's own spend cap; a deployment cap's reservations it left stay counted there
    PruneStep(spend_reservations, lambda ids: and_(spend_reservations.c.pipeline_id.in_(ids),
                                                   spend_reservations.c.scope.startswith("pipeline:"))),
    PruneStep(spend_caps, lambda ids: spend_caps.c.scope.in_([pipeline_scope(i) for i in ids])),
    # A budget reservation may still hold its room (a window can be a day, a prune's cut-off an hour): it is only
    # detached from the pipeline, and goes when its window has passed, as every reservation does.
    PruneStep(rate_reservations, lambda ids: rate_reservations.c.pipeline_id.in_(ids),
              kept_as={"pipeline_id": None, "epoch": None}, deletes=False),
    _by_pipeline(events),
    PruneStep(transitions, _uncounted_transitions_of),
    _by_pipeline(nodes),
)


def kept_on_purpose(table_name: str) -> bool:
    """Aggregates (costs over time) outlive the pipelines they add up: a prune never deletes from them."""
    return "total" in table_name or "aggregate" in table_name




# What a prune deletes: only pipelines whose ledger and items the roll-ups already hold, so the cost counters and
# the item counts never go backwards.
PRUNABLE_STATUSES = ROLLED_UP
_ENDED: list[ColumnElement[Any]] = [literal_column("'completed'"), literal_column("'failed'")]
# The partial index that serves each terminal status, by its own predicate, repeated verbatim in the query: SQLite
# uses a partial index only when the query's WHERE holds the index's WHERE (it does not prove that status =
# 'completed' implies status IN ('completed', 'failed')). Completed and failed: rx_pipelines_finished (status,
# completed_at); canceled: rx_pipelines_live (status, id).
_INDEXED_BY: dict[str, ColumnElement[Any]] = {"completed": p.status.in_(_ENDED), "failed": p.status.in_(_ENDED),
                                         "canceled": p.status.not_in(_ENDED)}


def _aged(cutoff: ColumnElement[Any], ended: bool) -> list[ColumnElement[Any]]:
    """Ended before ``cutoff``: by ``completed_at``, or (``ended`` False) for a finished pipeline without one, by
    ``updated_at``. The write that finishes a pipeline moves ``updated_at`` (not every write does), and nothing
    moves it back, so it is never earlier than the end it stands in for: such a pipeline is never pruned sooner
    than its end time would have had it. (``created_at`` and ``started_at`` are earlier than the end;
    ``heartbeat_at`` may be NULL too.)
    ``completed_at IS NULL`` is an equality on the status index's second column in both databases: the range
    holds only these rows, never the completed ones that ended after the cut-off."""
    if ended:
        return [p.completed_at.isnot(None), p.completed_at < cutoff]
    return [p.completed_at.is_(None), p.updated_at < cutoff]


def _prunable(cutoff: ColumnElement[Any], status: str, deployment: str | None, newest: int | None,
              ended: bool = True) -> list[ColumnElement[Any]]:
    """The ``newest`` pipeline is never prunable: SQLite gives a new row the highest id plus one, so deleting the
    newest would hand its id to the next pipeline, and a kept transition or an old run's tag would name it. It is
    excluded by ``<>``, a condition no index range serves, so both planners keep to the status indexes."""
    # The status inline, not bound, so PostgreSQL matches the partial indexes (rx_pipelines_finished for completed
    # and failed, rx_pipelines_live for canceled) under a generic plan too.
    where = [_INDEXED_BY[status], p.status == literal_column(f"'{status}'"), *_aged(cutoff, ended),
             p.id != (newest or 0)]
    return [*where, p.deployment == deployment] if deployment is not None else where


# Each indexed range a batch takes candidates from, in order: by status, those with an end time, then those without.
_RANGES = [(status, ended) for status in PRUNABLE_STATUSES for ended in (True, False)]


class Retention(Component):
    """Deleting the history of pipelines that finished long ago."""

    def prune_finished_pipelines(self, older_than_seconds: float, *, batch_size: int | None = None,
                                 deployment: str | None = None, time_budget: float | None = None,
                                 max_batches: int | None = None, dry_run: bool = False,
                                 progress: Callable[[PruneResult], None] | None = None) -> PruneResult:
        """Delete pipelines that finished more than ``older_than_seconds`` ago with their history, batch by batch.

        ``batch_size`` pipelines per transaction (default: the dialect's, 200 on PostgreSQL, 50 on SQLite, each
        batch a few thousand rows). Stops when none is left, or after the batch that spends ``time_budget`` seconds
        or makes ``max_batches``.
        ``dry_run`` only counts the pipelines that would go, by status. ``progress`` is called after each batch.
        """
        older_than_seconds = check_age("older_than_seconds", older_than_seconds)
        batch_size = self.dialect.prune_batch if batch_size is None else batch_size
        if not 1 <= batch_size <= 10_000:
            raise ValueError("batch_size must be from 1 to 10000")
        result = PruneResult(dry_run=dry_run)
        if dry_run:
            result.by_status, result.no_end_time = self._prunable_counts(older_than_seconds, deployment)
            result.pipelines, result.done = sum(result.by_status.values()), True
            return result
        started = time.monotonic()
        while True:
            batch_started = time.monotonic()
            counts, compacted, no_end_time = self._prune_batch(older_than_seconds, batch_size, deployment)
            if counts.get(pipelines.name, 0) == 0:
                result.done = True
                return result
            result.add(counts, time.monotonic() - batch_started, compacted)
            result.no_end_time += no_end_time
            result.pipelines = result.rows.get(pipelines.name, 0)
            if progress is not None:
                progress(result)
            if counts[pipelines.name] < batch_size:
                result.done = True
                return result
            if time_budget is not None and time.monotonic() - started >= time_budget:
                return result
            if max_batches is not None and result.batches >= max_batches:
                return result
            time.sleep(self.dialect.prune_pause(result.last_batch_seconds))

    @retried
    def _prunable_counts(self, older_than_seconds: float, deployment: str | None) -> tuple[dict[str, int], int]:
        """The prunable pipelines by status, and how many of them have no end time."""
        cutoff = self.dialect.now_plus(-float(older_than_seconds))
        with self.read() as conn:
            newest = conn.scalar(select(func.max(p.id)))
            counts = {(status, ended): conn.scalar(select(func.count()).where(
                *_prunable(cutoff, status, deployment, newest, ended))) or 0 for status, ended in _RANGES}
        by_status: dict[str, int] = {}
        for (status, _), n in counts.items():
            if n:
                by_status[str(status)] = by_status.get(str(status), 0) + n
        return by_status, sum(n for (_, ended), n in counts.items() if not ended)

    @retried
    def _prune_batch(self, older_than_seconds: float, batch_size: int,
                     deployment: str | None) -> tuple[dict[str, int], dict[str, int], int]:
        """One transaction: lock up to ``batch_size`` prunable pipelines, delete their rows, then them.
        Returns the rows deleted and the rows compacted, per table, and how many pipelines had no end time."""
        cutoff = self.dialect.now_plus(-float(older_than_seconds))
        with self.write() as conn:
            ids, no_end_time = self._lock_prunable(conn, cutoff, batch_size, deployment,
                                                   conn.scalar(select(func.max(p.id))))
            if not ids:
                return {}, {}, 0
            counts, compacted = {}, {}
            for step in PRUNE_STEPS:
                counts[step.table.name], compacted[step.table.name] = step.apply(conn, ids)
            finished = p.status.in_([literal_column(f"'{s}'") for s in PRUNABLE_STATUSES])
            counts[pipelines.name] = conn.execute(
                delete(pipelines).where(p.id.in_(ids), finished, or_(and_(*_aged(cutoff, True)),
                                                                     and_(*_aged(cutoff, False))))).rowcount or 0
        return counts, compacted, no_end_time

    def _lock_prunable(self, conn: Connection, cutoff: ColumnElement[Any], batch_size: int, deployment: str | None,
                       newest: int | None) -> tuple[list[int], int]:
        """Up to ``batch_size`` prunable pipeline ids, locked, and how many of them have no end time; one indexed
        range per terminal status and end time or none (a lock clause cannot follow a UNION, and an OR of the two
        would widen the range to every pipeline of the status). Rows another transaction holds are skipped, never
        waited for."""
        ids: list[int] = []
        no_end_time = 0
        for status, ended in _RANGES:
            if len(ids) >= batch_size:
                break
            found = list(conn.scalars(select(p.id).where(*_prunable(cutoff, status, deployment, newest, ended))
                                      .limit(batch_size - len(ids)).with_for_update(skip_locked=True)))
            ids += found
            no_end_time += 0 if ended else len(found)
        return ids, no_end_time
