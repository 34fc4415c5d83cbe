"""The run-level lifecycle of a pipeline: batched heartbeats, ownership by run, and how a run ends.

A Dagster run owns its pipeline from run start to run end. Its run worker heartbeats the
pipeline row; step processes heartbeat only the nodes they run. When the run ends, the
pipeline follows: a successful run skips the nodes it did not execute and completes the
pipeline, a failed run fails it, a user's cancel cancels it. A re-execution or a Dagster
run retry of the same logical run takes the pipeline over with a new epoch, but only when
its current owner is dead or the pipeline already ended in failure or cancellation.

Every write is fenced by the ownership epoch in the same transaction as the write.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Iterable, Sequence

from sqlalchemy import (BigInteger, Float, Integer, Text, and_, bindparam, exists, func, literal, or_, select, tuple_,
                        union_all, update)
from sqlalchemy import CompoundSelect, Select
from sqlalchemy.dialects.postgresql import ARRAY

from recovery_ext._store.database import Component, Database, Fence, chunks, retried
from recovery_ext._errors import IllegalTransition, NotFound, OwnershipLost
from recovery_ext._store.models import NodeBeat, Ownership, PipelineBeat
from recovery_ext._store.pipelines import NEW_OWNER_RESETS, PipelineCore
from recovery_ext._classify.redaction import redact
from recovery_ext._store.schema import nodes, pipelines
from recovery_ext._store.statuses import NodeStatus, PipelineStatus

p = pipelines.c

# SQLite allows at most 500 terms in a compound SELECT; the beat list is a UNION ALL.
BEAT_CHUNK = 400
# A node the run did not execute: never started, or failed earlier and not retried.
SKIPPABLE = (NodeStatus.PENDING, NodeStatus.FAILED)
# A pipeline a re-execution may reopen (a completed one is finished for good).
REOPENABLE = (PipelineStatus.FAILED, PipelineStatus.CANCELED)


def takeover_cause(status: str, owner: str | None, owner_dead: Sequence[str]) -> str:
    """Why a re-execution may take a pipeline over (only asked once it may): what ended its owner."""
    if status in REOPENABLE:
        return f"pipeline_{status}"
    if owner is None:
        return "no_owner"
    return "owner_run_dead" if owner in owner_dead else "heartbeat"


def _rows(columns: Sequence[tuple[str, type]], values: Sequence[tuple[Any, ...]]) -> Select[Any] | CompoundSelect[Any]:
    """``SELECT :a AS x, :b AS y UNION ALL ...``: a bound row list, linear in its size on both databases."""
    selects = [
        select(*[literal(v, type_=t()).label(name) for (name, t), v in zip(columns, row, strict=True)])
        for row in values
    ]
    return selects[0] if len(selects) == 1 else union_all(*selects)


class Runs(Component):
    """A pipeline's owner run: batched heartbeats, ownership by run, take-overs and how a run ends (a part of
    ``store.pipelines``). Its collaborators: ``rows`` (the pipeline and node moves every component shares) and
    ``fence`` (the owner's lock and epoch check)."""

    def __init__(self, db: Database, *, rows: PipelineCore, fence: Fence) -> None:
        super().__init__(db)
        self.rows = rows
        self.fence = fence

    # -- heartbeats ------------------------------------------------------------------------------

    @retried
    def pulse(self, pipeline_beats: Iterable[PipelineBeat] = (), node_beats: Iterable[NodeBeat] = ()) -> set[int]:
        """One transaction extending every heartbeat a process keeps alive.

        Pipeline rows are extended only while ``(id, epoch)`` still matches and the pipeline is
        running; node rows only while they are running and their pipeline still has that epoch.
        Returns the ids of pipelines whose ownership was lost (their rows are untouched).
        """
        pipeline_beats, node_beats = list(pipeline_beats), list(node_beats)
        if not pipeline_beats and not node_beats:
            return set()
        if self.dialect.dml_in_cte:
            return self._pulse_in_one_statement(pipeline_beats, node_beats)
        wanted = {(b.own.pipeline_id, b.own.epoch) for b in pipeline_beats} | {
            (b.own.pipeline_id, b.own.epoch) for b in node_beats}
        alive: set[int] = set()
        with self.write() as conn:
            by_timeout: dict[float, set[tuple[int, int]]] = {}
            for b in pipeline_beats:
                by_timeout.setdefault(b.timeout, set()).add((b.own.pipeline_id, b.own.epoch))
            for timeout, keys in by_timeout.items():
                for part in chunks(sorted(keys), BEAT_CHUNK):
                    beats = _rows((("id", Integer), ("epoch", Integer)), part).subquery("beats")
                    rows = conn.execute(
                        update(pipelines)
                        .where(p.status == PipelineStatus.RUNNING,
                               tuple_(p.id, p.epoch).in_(select(beats.c.id, beats.c.epoch)))
                        .values(heartbeat_at=self.dialect.now(), heartbeat_deadline=self.dialect.now_plus(timeout))
                        .returning(p.id)
                    )
                    alive.update(r.id for r in rows)
            node_by_timeout: dict[float, set[tuple[int, int, str]]] = {}
            for nb in node_beats:
                node_by_timeout.setdefault(nb.timeout, set()).add((nb.own.pipeline_id, nb.own.epoch, nb.node))
            for timeout, node_keys in node_by_timeout.items():
                for part in chunks(sorted(node_keys), BEAT_CHUNK):
                    beats = _rows((("id", Integer), ("epoch", Integer), ("node", Text)), part).subquery("beats")
                    fenced = select(beats.c.id, beats.c.node).where(
                        exists().where(p.id == beats.c.id, p.epoch == beats.c.epoch,
                                       p.status == PipelineStatus.RUNNING))
                    conn.execute(
                        update(nodes)
                        .where(nodes.c.status == NodeStatus.RUNNING,
                               tuple_(nodes.c.pipeline_id, nodes.c.name).in_(fenced))
                        .values(heartbeat_at=self.dialect.now(), heartbeat_deadline=self.dialect.now_plus(timeout))
                    )
            unchecked = sorted({pid for pid, _ in wanted} - alive)
            current = {}
            for part in chunks(unchecked):
                current.update({r.id: (r.epoch, r.status) for r in conn.execute(
                    select(p.id, p.epoch, p.status).where(p.id.in_(list(part))))})
        return {pid for pid, epoch in wanted
                if pid not in alive and current.get(pid) != (epoch, PipelineStatus.RUNNING)}

    def _pulse_in_one_statement(self, pipeline_beats: list[PipelineBeat], node_beats: list[NodeBeat]) -> set[int]:
        """PostgreSQL: every beat in ONE autocommit statement, linear in its size.

        The beat list is four bound arrays unnested into rows; both UPDATEs are data-modifying
        CTEs joined against it, and the main query reports the pipelines no longer held. No
        index covers the heartbeat columns (migration 0007), so these are HOT updates.
        """
        beats = [(b.own.pipeline_id, b.own.epoch, None, b.timeout) for b in pipeline_beats] + [
            (b.own.pipeline_id, b.own.epoch, b.node, b.timeout) for b in node_beats]
        columns = list(zip(*beats, strict=True))
        rows = select(func.unnest(
            bindparam("beat_ids", list(columns[0]), ARRAY(BigInteger)),
            bindparam("beat_epochs", list(columns[1]), ARRAY(Integer)),
            bindparam("beat_nodes", list(columns[2]), ARRAY(Text)),
            bindparam("beat_timeouts", list(columns[3]), ARRAY(Float)),
        ).table_valued("id", "epoch", "node", "timeout").render_derived(name="b")).cte("beats")
        now = self.dialect.now()
        extended = self.dialect.now_plus(rows.c.timeout)
        held = and_(p.id == rows.c.id, p.epoch == rows.c.epoch, p.status == PipelineStatus.RUNNING)
        pipeline_update = (update(pipelines).where(rows.c.node.is_(None), held)
                           .values(heartbeat_at=now, heartbeat_deadline=extended).returning(p.id)
                           .cte("pipeline_beats"))
        # The node UPDATE waits for the pipeline UPDATE (an InitPlan over its result), so this
        # statement locks pipeline rows before node rows, like every other transaction.
        pipelines_first = select(func.count()).select_from(pipeline_update).scalar_subquery() >= 0
        node_update = (update(nodes)
                       .where(pipelines_first, nodes.c.pipeline_id == rows.c.id, nodes.c.name == rows.c.node,
                              nodes.c.status == NodeStatus.RUNNING, exists().where(held))
                       .values(heartbeat_at=now, heartbeat_deadline=extended).cte("node_beats"))
        wanted = select(rows.c.id, rows.c.epoch).distinct().subquery("wanted")
        current = pipelines.alias("current")
        lost = (select(wanted.c.id)
                .select_from(wanted.outerjoin(current, current.c.id == wanted.c.id))
                .where(or_(current.c.id.is_(None), current.c.epoch != wanted.c.epoch,
                           current.c.status != PipelineStatus.RUNNING))
                .add_cte(node_update))
        with self.autocommit() as conn:
            return set(conn.scalars(lost))

    @retried
    def heartbeat(self, beats: Sequence[tuple[Ownership, str | None]], timeout: float) -> set[int]:
        """Extend many pipelines and, where named, their nodes at once; returns the lost pipeline ids."""
        return self.pulse([PipelineBeat(own, timeout) for own, _ in beats],
                          [NodeBeat(own, name, timeout) for own, name in beats if name])

    # -- ownership by run ------------------------------------------------------------------------

    @retried
    def owned_by(self, run_id: str) -> Ownership | None:
        """The running pipeline ``run_id`` owns, if any."""
        with self.read_statement() as conn:
            row = conn.execute(
                select(p.id, p.epoch).where(p.owner == run_id, p.status == PipelineStatus.RUNNING)
                .order_by(p.id).limit(1)
            ).first()
        return None if row is None else Ownership(row.id, row.epoch, run_id)

    @retried
    def formerly_owned_by(self, run_id: str) -> int | None:
        """A pipeline ``run_id`` created or once owned (to say who superseded it)."""
        with self.read_statement() as conn:
            return conn.scalar(
                select(p.id).where(or_(p.origin_run_id == run_id, p.resumed_from == run_id, p.owner == run_id))
                .order_by(p.id.desc()).limit(1)
            )

    @retried
    def take_over(self, pipeline_id: int, run_id: str, *, owner_dead: Sequence[str] = (),
                  heartbeat_timeout: float = 90.0, reason: str | None = None) -> Ownership:
        """A re-execution or run retry of the same logical run becomes the owner, with a new epoch.

        Allowed when the pipeline is failed or canceled, or running with an owner that is dead:
        listed in ``owner_dead`` (Dagster shows its run FAILURE or CANCELED), or whose
        heartbeat expired on the database clock. Failed and running nodes become pending;
        completed nodes and their item checkpoints are kept. Raises OwnershipLost otherwise.
        A ``pipeline_taken_over`` event records it (with its cause and ``reason``), as a reclaim records
        ``pipeline_recovered``.
        """
        with self.write() as conn:
            row = conn.execute(
                select(p.id, p.status, p.owner, p.epoch, p.job_name,
                       and_(p.heartbeat_deadline.isnot(None),
                            p.heartbeat_deadline < self.dialect.now()).label("expired"))
                .where(p.id == pipeline_id).with_for_update()
            ).first()
            if row is None:
                raise NotFound(f"no pipeline {pipeline_id}")
            if row.owner == run_id and row.status == PipelineStatus.RUNNING:
                return Ownership(pipeline_id, row.epoch, run_id)
            dead = row.owner is None or row.owner in owner_dead or bool(row.expired)
            if not (row.status in REOPENABLE or (row.status == PipelineStatus.RUNNING and dead)):
                raise OwnershipLost(owner=row.owner or "(none)", pipeline_id=pipeline_id, status=row.status)
            epoch = row.epoch + 1
            conn.execute(
                update(pipelines).where(p.id == pipeline_id, p.epoch == row.epoch)
                .values(status=PipelineStatus.RUNNING, owner=run_id, resumed_from=row.owner, epoch=epoch,
                        completed_at=None, **NEW_OWNER_RESETS,
                        error=None, gave_up_reason=None, current_node=None, heartbeat_at=self.dialect.now(),
                        heartbeat_deadline=self.dialect.now_plus(heartbeat_timeout), updated_at=self.dialect.now())
            )
            reset = conn.execute(
                select(nodes.c.id, nodes.c.name, nodes.c.status)
                .where(nodes.c.pipeline_id == pipeline_id, nodes.c.status.in_((NodeStatus.RUNNING, NodeStatus.FAILED)))
            ).all()
            if reset:
                conn.execute(
                    update(nodes).where(nodes.c.id.in_([r.id for r in reset]))
                    .values(status=NodeStatus.PENDING, heartbeat_deadline=None, stall_deadline=None,
                            updated_at=self.dialect.now())
                )
            self.record_transitions(conn, [
                {"entity_type": "pipeline", "entity_id": pipeline_id, "pipeline_id": pipeline_id,
                 "from_status": row.status, "to_status": PipelineStatus.RUNNING, "event": "taken_over",
                 "data": {"previous_owner": row.owner, "owner": run_id, "epoch": epoch,
                          "reset_nodes": [r.name for r in reset]}},
                *[{"entity_type": "node", "entity_id": r.id, "pipeline_id": pipeline_id,
                   "from_status": r.status, "to_status": NodeStatus.PENDING, "event": "reset_by_takeover",
                   "data": {"owner": run_id}} for r in reset],
            ])
            self.record_events(conn, [{"kind": "pipeline_taken_over", "pipeline_id": pipeline_id, "payload": {
                "previous_owner": row.owner, "owner": run_id, "epoch": epoch, "job": row.job_name,
                "cause": takeover_cause(row.status, row.owner, owner_dead), "reason": reason,
                "reset_nodes": [r.name for r in reset]}}])
        return Ownership(pipeline_id, epoch, run_id)

    # -- how a run ends --------------------------------------------------------------------------

    @retried
    def complete_run(self, own: Ownership) -> list[str]:
        """The run succeeded: nodes it did not execute become ``skipped`` and the pipeline completes.

        Returns the skipped node names. A node still ``running`` means a step of this run is
        unaccounted for; that is refused (IllegalTransition) and left to recovery. When the run's
        last node already completed the pipeline (the common case) nothing is written, and the
        transaction commits: a rollback would also drop the connection's prepared statements.
        """
        with self.write() as conn:
            if self.fence.check(conn, own, completed_ok=True) == PipelineStatus.COMPLETED:
                return []
            running = conn.scalars(select(nodes.c.name).where(nodes.c.pipeline_id == own.pipeline_id,
                                                                nodes.c.status == NodeStatus.RUNNING)).all()
            if running:
                raise IllegalTransition(f"pipeline {own.pipeline_id}: the run ended with nodes still running: "
                                        f"{', '.join(running)}")
            skipped = conn.execute(
                select(nodes.c.id, nodes.c.name, nodes.c.status)
                .where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.status.in_(SKIPPABLE))
            ).all()
            if skipped:
                conn.execute(
                    update(nodes).where(nodes.c.id.in_([r.id for r in skipped]), nodes.c.status.in_(SKIPPABLE))
                    .values(status=NodeStatus.SKIPPED, updated_at=self.dialect.now(), stall_deadline=None)
                )
            self.record_transitions(conn, [
                {"entity_type": "node", "entity_id": r.id, "pipeline_id": own.pipeline_id,
                 "from_status": r.status, "to_status": NodeStatus.SKIPPED, "event": NodeStatus.SKIPPED,
                 "data": {"epoch": own.epoch, "owner": own.owner, "reason": "not executed by the successful run"}}
                for r in skipped
            ])
            self.rows.finish_pipeline(conn, own, PipelineStatus.COMPLETED)
        return [r.name for r in skipped]

    @retried
    def fail_run(self, own: Ownership, error: str) -> None:
        """The run failed for good (no node left running): the pipeline fails with the step's error."""
        with self.write() as conn:
            self.fence.check(conn, own)
            self.rows.fail_running_nodes_of(conn, own, "run failed")
            self.rows.finish_pipeline(conn, own, PipelineStatus.FAILED, error=redact(error)[:4000])

    @retried
    def cancel_run(self, own: Ownership, reason: str) -> None:
        """The user canceled the owning run: the pipeline becomes ``canceled`` (terminal, never resumed)."""
        with self.write() as conn:
            self.fence.check(conn, own)
            self.rows.fail_running_nodes_of(conn, own, "pipeline canceled")
            self.rows.finish_pipeline(conn, own, PipelineStatus.CANCELED, reason=redact(reason))
            self.record_events(conn, [{"kind": "pipeline_canceled", "pipeline_id": own.pipeline_id,
                                       "payload": {"owner": own.owner, "reason": redact(reason)}}])
