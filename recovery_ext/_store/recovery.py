"""``store.recovery``: the orphan sensor's component, and the orphans it finds, gives up on and reclaims.

A reader follows one crash's recovery pass top to bottom here: :class:`Recovery` (the component the sensor
calls: one read per tick, one write per pass) and its collaborator :class:`Orphans` (the conditions and the
writes the pass is made of).

The orphan sensor's two transactions: one read of what to ask the orchestrator, one write of the outcome.
An idle tick is the read alone. Everything a tick decides (cancel, extend reservations, fail corrupt
rows, give up, reclaim, reserve what the CLI reclaimed, record the pass) commits in one transaction,
so a tick never leaves half its decisions behind and costs the database two round trips of
transactions however many steps it has.

A reclaim is one conditional UPDATE over candidates locked ``FOR UPDATE SKIP LOCKED``
(SQLite: inside a ``BEGIN IMMEDIATE`` transaction), so when several scanners race,
each orphan is won by exactly one of them. In the same transaction the winner bumps
the epoch, resets the running nodes to pending, and records transitions and events.

Which Dagster instance may act on a pipeline: the one that holds its first run. A deployment name says
which instance's sensor owns a pipeline, but two instances may share a name by accident, and a
deployment may be renamed. So before a tick acts on a pipeline it asks its own
Dagster instance whether it holds the pipeline's first run (``origin_run_id``):

* a pipeline of this deployment whose first run this instance does not hold is another instance's:
  the tick stands aside (no reclaim, no give-up, no resume request) and says why;
* an orphan of another deployment whose first run this instance holds was this instance's before a
  rename: it is adopted into this deployment and resumed; so is such a pipeline already reclaimed for a
  resume run (by ``recovery-ext recover``), whose resume only its deployment's sensor would request;
* an orphan of another deployment that nobody reclaims (its deployment's sensor is gone) is reported
  in the tick and in ``recovery-ext status``, never left silently.

The read of first runs is the tick's snapshot; the Dagster questions are asked by the sensor
(``RunControl.known_runs``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (Connection, Row, Text, and_, case, cast, exists, func, literal, literal_column, or_, select,
                        type_coerce, update)
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._conventions import PLACEHOLDER_PREFIX, CorruptJson
from recovery_ext._store.database import Component, Database, chunks, retried
from recovery_ext._store.dialects import DbTime
from recovery_ext._store.models import (LEGACY_DEPLOYMENT, FirstRun, ForeignOrphan, GivenUp, Orphan, PassPlan,
                                        PassResult, Reclaimed, Scope, TickSnapshot)
from recovery_ext._store.pipelines import NEW_OWNER_RESETS, PipelineCore
from recovery_ext._store.schema import NODE_STATUSES, PIPELINE_STATUSES, nodes, pipelines, waiting_shown
from recovery_ext._store.statuses import NodeStatus, PipelineStatus

p = pipelines.c

# Inline constants, not bound parameters, so PostgreSQL can match the partial indexes
# (rx_pipelines_live, rx_nodes_running) even under a generic plan.
RUNNING: ColumnElement[str] = literal_column("'running'")
# INTEGER columns: one below PostgreSQL's maximum, so ``+ 1`` always fits.
MAX_COUNTER = 2**31 - 1
LIVE = p.status.not_in([literal_column("'completed'"), literal_column("'failed'")])

FIRST_RUNS_LIMIT = 10_000   # pipelines a tick checks against its Dagster instance at most (a mass kill's worth)
STRANDED_AFTER = 600.0      # seconds an orphan may go unreclaimed before status calls it stranded


class Recovery(Component):
    """``store.recovery``, the orphan sensor's component
    (:class:`~recovery_ext._store.interfaces.RecoveryPassStore`): one snapshot per tick and one recovery pass
    when there is work.

    Its collaborators are attributes: ``orphans`` (finding orphans, giving up on hopeless ones, reclaiming the
    rest) and ``pipeline_rows`` (the pipeline moves every component shares: here, canceling the pipelines of
    canceled runs).
    """

    def __init__(self, db: Database, *, orphans: Orphans, pipeline_rows: PipelineCore) -> None:
        super().__init__(db)
        self.orphans = orphans
        self.pipeline_rows = pipeline_rows

    @retried
    def tick_snapshot(self, scope: Scope, *, grace_seconds: float, waiting_limit: int = 4) -> TickSnapshot:
        """Owners to ask the orchestrator about, reservations to re-request, and whether a write is due."""
        in_scope = _jobs(scope.job_names, scope.deployment)
        live = and_(LIVE, p.status == RUNNING, *in_scope)
        # due without any orchestrator answer: expired or stalled by the database clock, a corrupt row,
        # or a pipeline the CLI reclaimed that awaits a launcher
        due = or_(
            self.orphans.orphan_condition((), scope.job_names, (), scope.deployment),
            and_(p.owner.is_(None), p.resume_count > 0),
            *[cond for cond, _ in self.orphans.corrupt_checks()],
        )
        with self.read() as conn:
            owners = conn.execute(
                select(p.owner, p.owner == _placeholder(p.resume_count),
                       p.heartbeat_deadline < self.dialect.now_plus(grace_seconds / 2))
                .where(live, p.owner.isnot(None), ~self.dialect.not_text(p.owner))  # a blob owner is a bad row
            ).all()
            is_due = conn.scalar(select(exists().where(LIVE, *in_scope, due)))
            awaiting = self.orphans.awaiting(conn, scope, launcher_only=True) if any(o[1] for o in owners) else []
            legacy = {}
            if scope.deployment is not None and scope.deployment != LEGACY_DEPLOYMENT:
                legacy = {r.origin_run_id: r.id for r in conn.execute(
                    select(p.id, p.origin_run_id).where(LIVE, p.status == RUNNING, p.origin_run_id.isnot(None),
                                                        p.deployment == LEGACY_DEPLOYMENT,
                                                        *_jobs(scope.job_names)))}
            first_runs, foreign = self._first_runs_to_check(conn, scope, grace_seconds)
            waiting = [dict(r._mapping) for r in conn.execute(
                select(p.id, p.job_name, p.waiting_until, p.waiting_since, p.waiting_reason)
                .where(live, waiting_shown(self.dialect.now())).order_by(p.waiting_until).limit(waiting_limit))]
        placeholders = sorted({o[0] for o in owners if o[1]})
        return TickSnapshot(
            run_owners=sorted({o[0] for o in owners if not o[1]}),
            placeholders=placeholders,
            stale_placeholders=sorted({o[0] for o in owners if o[1] and o[2]}),
            awaiting=awaiting,
            waiting=waiting,
            due=bool(is_due),
            legacy_origins=legacy,
            first_runs=first_runs,
            foreign_orphans=foreign,
        )

    def _first_runs_to_check(self, conn: Connection, scope: Scope, grace_seconds: float,
                             ) -> tuple[list[FirstRun], list[ForeignOrphan]]:
        """In the tick's read: this deployment's live pipelines with their first runs, the likeliest orphans
        first (a tick acts only on the ones it checked: see ``Scope.acting_on``), and the orphans of other
        deployments."""
        if scope.deployment is None:
            return [], []
        # orphans, and pipelines reclaimed for a resume run (a launcher-less reclaim's, or one a sensor of the
        # same name reserved): an instance re-requests those when its Dagster has no such run yet
        reserved_any = and_(p.status == PipelineStatus.RUNNING, p.resume_count > 0,
                            or_(p.owner.is_(None), p.owner == _placeholder(p.resume_count)),
                            *([p.job_name.in_(list(scope.job_names))] if scope.job_names else []))
        reserved = and_(p.deployment == scope.deployment, reserved_any)
        actionable = or_(self.orphans.orphan_condition((), scope.job_names, (), scope.deployment), reserved)
        first = [FirstRun(r.id, r.origin_run_id, bool(r.actionable)) for r in conn.execute(
            select(p.id, p.origin_run_id, actionable.label("actionable"))
            .where(p.deployment == scope.deployment, p.status == PipelineStatus.RUNNING, p.origin_run_id.isnot(None),
                   *([p.job_name.in_(list(scope.job_names))] if scope.job_names else []))
            .order_by(p.heartbeat_deadline.asc().nulls_first(), p.id).limit(FIRST_RUNS_LIMIT))]
        stale = and_(p.heartbeat_deadline.isnot(None), p.heartbeat_deadline < self.dialect.now_plus(-grace_seconds))
        foreign = [ForeignOrphan(r.id, r.deployment, r.origin_run_id, bool(r.stale)) for r in conn.execute(
            select(p.id, p.deployment, p.origin_run_id, stale.label("stale"))
            # another deployment's reserved pipelines too: `recovery-ext recover`, run by hand after a rename,
            # reclaims them for a resume run that only a sensor adopting them would ever request
            .where(or_(self.orphans.orphan_condition((), scope.job_names, (), None), reserved_any),
                   p.origin_run_id.isnot(None), p.deployment.not_in([scope.deployment, LEGACY_DEPLOYMENT]))
            .order_by(p.id).limit(FIRST_RUNS_LIMIT))]
        return first, foreign

    @retried
    def recovery_pass(self, plan: PassPlan, scope: Scope) -> PassResult:
        """Everything one tick decides, in one transaction; the recovery stats are recorded with it."""
        result = PassResult()
        with self.write() as conn:
            if plan.adopt_pipelines and scope.deployment is not None:
                for part in chunks(sorted(plan.adopt_pipelines)):
                    result.adopted += conn.execute(
                        # the sensor checked that its Dagster instance holds each one's first run
                        update(pipelines).where(p.id.in_(list(part)), p.deployment != scope.deployment)
                        .values(deployment=scope.deployment)).rowcount
            if plan.canceled_owner_runs:
                result.canceled = self.pipeline_rows.cancel_owned_by(conn, plan.canceled_owner_runs)
            if plan.extend_placeholders:
                result.extended = self.orphans.extend_launch_grace(conn, plan.extend_placeholders,
                                                                   plan.launch_grace_seconds)
            corrupt = self.orphans.fail_unknown_statuses(conn, scope.deployment)
            result.given_up = self.orphans.give_up_hopeless(conn, plan.dead_owner_runs, plan.retrying_owner_runs,
                                                            plan.max_age_seconds, scope)
            if plan.limit is None or plan.limit > 0:
                result.reclaimed, corrupt_rows = self.orphans.reclaim(conn, plan, scope)
                corrupt += corrupt_rows
            result.corrupt = corrupt
            if plan.launching:
                left = None if plan.limit is None else plan.limit - len(result.reclaimed)
                if left is None or left > 0:
                    result.claimed = self.orphans.claim_awaiting(conn, left, plan.launch_grace_seconds, scope)
                result.awaiting = self.orphans.awaiting(conn, scope, launcher_only=True,
                                                        fresh=[*result.reclaimed, *result.claimed])
            found = len(result.reclaimed) + len(result.given_up) + len(result.corrupt)
            if found:
                self.record_events(conn, [{"kind": "recovery_completed", "payload": {
                    "trigger": plan.trigger, "found": found, "reclaimed": len(result.reclaimed),
                    "given_up": len(result.given_up) + len(result.corrupt), "corrupt": len(result.corrupt),
                    "deployment": scope.deployment}}])
        return result

    @retried
    def stranded_pipelines(self, *, older_than_seconds: float = STRANDED_AFTER, limit: int = 100
                           ) -> list[dict[str, Any]]:
        """Orphans (by the database clock) that no sensor reclaimed for ``older_than_seconds``: their
        deployment's orphan sensor is not running, or the deployment was renamed."""
        query = (select(p.id, p.job_name, p.deployment, p.owner, p.origin_run_id, p.heartbeat_deadline)
                 .where(p.status == PipelineStatus.RUNNING, p.heartbeat_deadline.isnot(None),
                        p.heartbeat_deadline < self.dialect.now_plus(-older_than_seconds))
                 .order_by(p.heartbeat_deadline, p.id).limit(limit))
        with self.read() as conn:
            return [{**r._mapping, "reason": f"orphaned over {older_than_seconds:g} s ago and not reclaimed: no orphan "
                     f"sensor of deployment {r.deployment!r} is acting on it (stopped, or renamed? a sensor adopts "
                     "it when its Dagster instance holds the first run)"} for r in conn.execute(query)]

    # The rest of the component's calls are its collaborators', named here so a caller sees the whole surface.

    def find_orphans(self, *, dead_owner_runs: Sequence[str] = (), limit: int | None = None,
                     job_names: Sequence[str] | None = None, retrying_owner_runs: Sequence[str] = (),
                     deployment: str | None = None) -> list[Orphan]:
        """:meth:`Orphans.find_orphans`."""
        return self.orphans.find_orphans(dead_owner_runs=dead_owner_runs, limit=limit, job_names=job_names,
                                         retrying_owner_runs=retrying_owner_runs, deployment=deployment)


    def record_superseded_runs(self, outcomes: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """:meth:`Orphans.record_superseded_runs`."""
        self.orphans.record_superseded_runs(outcomes)


class Orphans(Component):
    # -- conditions ---------------------------------------------------------------------------

    def _stalled(self, now: ColumnElement[Any]) -> ColumnElement[Any]:
        return exists().where(
            nodes.c.pipeline_id == p.id, nodes.c.status == RUNNING,
            nodes.c.stall_deadline.isnot(None), nodes.c.stall_deadline < now,
        )

    def _node_heartbeat_expired(self, now: ColumnElement[Any]) -> ColumnElement[Any]:
        """A running node whose own heartbeat expired and whom no watcher vouches for: its step
        process died (or its host did) while the run worker may still be alive. A node its watcher
        still vouches for is slow, not dead (its ``vouched_until`` is ahead); one its watcher reported dead
        waits for its run worker to let go (:meth:`_node_died`), however late its heartbeat."""
        return and_(exists().where(
            nodes.c.pipeline_id == p.id, nodes.c.status == RUNNING,
            nodes.c.heartbeat_deadline.isnot(None), nodes.c.heartbeat_deadline < now,
            or_(nodes.c.vouched_until.is_(None), nodes.c.vouched_until < now), nodes.c.died_at.is_(None),
        ), self._no_live_node(now))

    def _node_died(self) -> ColumnElement[Any]:
        """A running node whose watcher saw its step process gone.

        Not a reason to reclaim by itself: the run worker that reported it is alive, ends its run
        (Dagster runs what does not depend on the dead step) and then hands the pipeline to recovery at
        once (:meth:`leave_to_recovery`). Reclaiming under a live run worker would race it: it may still
        be starting steps, and Dagster's pool slots it holds are freed only when its run ends. It names
        the cause of the reclaim that follows."""
        return exists().where(nodes.c.pipeline_id == p.id, nodes.c.status == RUNNING, nodes.c.died_at.isnot(None))

    def _no_live_node(self, now: ColumnElement[Any]) -> ColumnElement[Any]:
        """No running node of the pipeline is alive by its own heartbeat or its watcher's word.

        A reclaim resets every running node and moves the epoch, which stops them all. So a
        pipeline that lost a node while its run worker lives is reclaimed once its live nodes have
        finished, never from under them: a live node is never reset for a sibling's death.
        """
        live = nodes.alias("live_node")
        return ~exists().where(
            live.c.pipeline_id == p.id, live.c.status == RUNNING, live.c.died_at.is_(None),
            or_(live.c.heartbeat_deadline >= now, live.c.vouched_until >= now),
        )

    def _expired_node_heartbeat_at(self, now: ColumnElement[Any]) -> ColumnElement[Any]:
        """The last pulse of the longest-silent running node whose heartbeat expired (None: no such node)."""
        return (select(func.min(nodes.c.heartbeat_at))
                .where(nodes.c.pipeline_id == p.id, nodes.c.status == RUNNING,
                       nodes.c.heartbeat_deadline.isnot(None), nodes.c.heartbeat_deadline < now)
                .scalar_subquery())

    def orphan_condition(self, dead_owner_runs: Sequence[str] = (),
                          job_names: Sequence[str] | None = None,
                          retrying_owner_runs: Sequence[str] = (), deployment: str | None = None) -> ColumnElement[Any]:
        """Running, and one of: the run's heartbeat expired (NULL heartbeat: never by heartbeat),
        a running node's heartbeat expired, a node stalled, the hard deadline passed, or Dagster
        reports the owning run dead. Never for an owner in ``retrying_owner_runs`` (Dagster is
        retrying it, so the retry takes the pipeline over; or its user is canceling it)."""
        now = self.dialect.now()
        cond = or_(
            and_(p.heartbeat_deadline.isnot(None), p.heartbeat_deadline < now),
            and_(p.deadline.isnot(None), p.deadline < now),
            self._node_heartbeat_expired(now),
            self._stalled(now),
        )
        if dead_owner_runs:
            cond = or_(cond, p.owner.in_(list(dead_owner_runs)))
        excluded = [or_(p.owner.is_(None), p.owner.not_in(list(retrying_owner_runs)))] if retrying_owner_runs else []
        return and_(LIVE, p.status == RUNNING, cond, *excluded, *_jobs(job_names, deployment))

    def _hopeless_condition(self, max_age_seconds: float | None) -> ColumnElement[Any]:
        now = self.dialect.now()
        cond = or_(p.resume_count >= p.max_resumes, and_(p.deadline.isnot(None), p.deadline < now))
        if max_age_seconds:
            cond = or_(cond, p.created_at < self.dialect.now_plus(-float(max_age_seconds)))
        return cond

    def _reason(self, dead_owner_runs: Sequence[str]) -> ColumnElement[Any]:
        now = self.dialect.now()
        whens = [(self._node_died(), "node_died")]  # the root cause; its run's end or death follows from it
        if dead_owner_runs:
            whens.append((p.owner.in_(list(dead_owner_runs)), "owner_run_dead"))
        whens += [
            (and_(p.deadline.isnot(None), p.deadline < now), "deadline"),
            (and_(p.heartbeat_deadline.isnot(None), p.heartbeat_deadline < now), "heartbeat"),
            (self._node_heartbeat_expired(now), "node_heartbeat"),
        ]
        return case(*whens, else_=literal("stalled"))

    # -- queries -------------------------------------------------------------------------------

    @retried
    def find_orphans(self, *, dead_owner_runs: Sequence[str] = (), limit: int | None = None,
                     job_names: Sequence[str] | None = None, retrying_owner_runs: Sequence[str] = (),
                     deployment: str | None = None) -> list[Orphan]:
        query = (
            select(p.id, p.job_name, p.owner, p.epoch, p.resume_count, p.max_resumes,
                   self._reason(dead_owner_runs).label("reason"), p.heartbeat_deadline, p.deadline)
            .where(self.orphan_condition(dead_owner_runs, job_names, retrying_owner_runs, deployment))
            .order_by(p.heartbeat_deadline.asc().nulls_first(), p.id)
        )
        if limit:
            query = query.limit(limit)
        with self.read() as conn:
            return [Orphan(**r._mapping) for r in conn.execute(query)]

    def awaiting(self, conn: Connection, scope: Scope, *, launcher_only: bool = False,
                  fresh: Sequence[Reclaimed] = ()) -> list[Reclaimed]:
        """The pipelines reserved for a resume run that has not attached yet. ``fresh``: those this pass just
        reserved, which already carry their params: only the others' params are read (after a mass kill,
        decoding ten thousand params twice would be a good part of the tick)."""
        where = [LIVE, p.status == RUNNING, p.owner == _placeholder(p.resume_count),
                 *_jobs(scope.job_names, scope.deployment)]
        if launcher_only:  # only the sensor that reserved a pipeline re-requests its run (or nobody did)
            where.append(or_(p.launcher.is_(None), p.launcher == scope.launcher))
        rows = conn.execute(
            select(p.id, p.job_name, p.resumed_from, p.owner, p.epoch, p.resume_count,
                   p.origin_run_id, p.launcher).where(*where).order_by(p.id)
        ).all()
        known = {r.pipeline_id: r.params for r in fresh}
        params = dict(known)
        for part in chunks([r.id for r in rows if r.id not in known]):
            params.update(conn.execute(select(p.id, p.params).where(p.id.in_(list(part)))).tuples().all())
        return [Reclaimed(r.id, r.job_name, params.get(r.id), r.resumed_from, r.owner, r.epoch, r.resume_count,
                          origin_run_id=r.origin_run_id, launcher=r.launcher) for r in rows]

    def extend_launch_grace(self, conn: Connection, placeholders: Sequence[str], grace_seconds: float) -> int:
        changed = 0
        for part in chunks(sorted(placeholders)):
            changed += conn.execute(
                update(pipelines)
                .where(p.owner.in_(list(part)), p.status == PipelineStatus.RUNNING,
                       p.owner == _placeholder(p.resume_count),
                       p.heartbeat_deadline < self.dialect.now_plus(grace_seconds / 2))
                .values(heartbeat_deadline=self.dialect.now_plus(grace_seconds))
            ).rowcount
        return changed

    @retried
    def record_superseded_runs(self, outcomes: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """What stopping each superseded run achieved (``superseded_run_stopped`` events)."""
        with self.write() as conn:
            self.record_events(conn, [{"kind": "superseded_run_stopped", "pipeline_id": pipeline_id, "payload": payload}
                                      for pipeline_id, payload in outcomes])

    # -- give up -------------------------------------------------------------------------------

    def give_up_hopeless(self, conn: Connection, dead_owner_runs: Sequence[str], retrying_owner_runs: Sequence[str],
                          max_age_seconds: float | None, scope: Scope, limit: int = 10_000) -> list[GivenUp]:
        now = self.dialect.now()
        reason = case(
            (and_(p.deadline.isnot(None), p.deadline < now), literal("hard deadline passed")),
            (p.resume_count >= p.max_resumes,
             literal("gave up after ") + cast(p.resume_count, Text) + literal(" resumes (maximum ")
             + cast(p.max_resumes, Text) + literal(")")),
            else_=literal(f"older than the maximum age of {max_age_seconds} s"),
        )
        candidates = (
            select(p.id)
            .where(self.orphan_condition(dead_owner_runs, scope.job_names, retrying_owner_runs, scope.deployment),
                   self._hopeless_condition(max_age_seconds), *_outside(scope))
            .order_by(p.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        ids = [r.id for r in conn.execute(candidates)]
        if not ids:
            return []
        rows = conn.execute(
            update(pipelines)
            .where(p.id.in_(ids), p.status == PipelineStatus.RUNNING)
            .values(status=PipelineStatus.FAILED, gave_up_reason=reason, error=reason, completed_at=now, updated_at=now,
                    heartbeat_deadline=None, current_node=None)
            .returning(p.id, p.job_name, p.owner, p.gave_up_reason)
        ).all()
        given_up = [GivenUp(r.id, r.job_name, r.owner, r.gave_up_reason) for r in rows]
        self._fail_running_nodes(conn, [g.pipeline_id for g in given_up], "given_up")
        self._record_failed(conn, given_up, "given_up", lambda g: {"owner": g.previous_owner, "job": g.job_name})
        return given_up

    def _record_failed(self, conn: Connection, given_up: Sequence[GivenUp], event: str,
                       details: Callable[[GivenUp], dict[str, Any]] = lambda _: {}) -> None:
        """The transitions (running -> failed, by ``event``) and ``pipeline_stuck`` events of pipelines given up."""
        self.record_transitions(conn, [
            {"entity_type": "pipeline", "entity_id": g.pipeline_id, "pipeline_id": g.pipeline_id,
             "from_status": PipelineStatus.RUNNING, "to_status": PipelineStatus.FAILED, "event": event,
             "data": {"reason": g.reason}}
            for g in given_up
        ])
        self.record_events(conn, [
            {"kind": "pipeline_stuck", "pipeline_id": g.pipeline_id, "payload": {"reason": g.reason, **details(g)}}
            for g in given_up
        ])

    def _fail_running_nodes(self, conn: Connection, pipeline_ids: list[int], event: str) -> None:
        if not pipeline_ids:
            return
        rows = conn.execute(
            update(nodes)
            .where(nodes.c.pipeline_id.in_(pipeline_ids), nodes.c.status == NodeStatus.RUNNING)
            .values(status=NodeStatus.FAILED, error=f"pipeline {event.replace('_', ' ')}",
                    updated_at=self.dialect.now())
            .returning(nodes.c.id, nodes.c.pipeline_id)
        ).all()
        self.record_transitions(conn, [
            {"entity_type": "node", "entity_id": r.id, "pipeline_id": r.pipeline_id, "from_status": NodeStatus.RUNNING,
             "to_status": NodeStatus.FAILED, "event": event} for r in rows
        ])

    # -- reclaim -------------------------------------------------------------------------------

    def reclaim(self, conn: Connection, plan: PassPlan, scope: Scope) -> tuple[list[Reclaimed], list[GivenUp]]:
        dead_owner_runs, launching = plan.dead_owner_runs, plan.launching
        launcher = scope.launcher
        now = self.dialect.now()
        candidates = (
            select(p.id, p.owner.label("previous_owner"), self._reason(dead_owner_runs).label("cause"),
                   p.heartbeat_deadline, p.heartbeat_at,
                   self._expired_node_heartbeat_at(now).label("node_heartbeat_at"),
                   type_coerce(now, DbTime).label("now"))
            .where(self.orphan_condition(dead_owner_runs, scope.job_names, plan.retrying_owner_runs,
                                          scope.deployment),
                   ~self._hopeless_condition(plan.max_age_seconds), *_outside(scope),
                   p.epoch < MAX_COUNTER, p.resume_count < MAX_COUNTER)  # those are failed as corrupt instead
            .order_by(p.heartbeat_deadline.asc().nulls_first(), p.id)
            .limit(plan.limit)
            .with_for_update(skip_locked=True)
        )
        found = conn.execute(candidates).all()  # LIMIT NULL is no limit
        if not found:
            return [], []
        previous = {r.id: r.previous_owner for r in found}
        causes = {r.id: r.cause for r in found}
        heartbeating = {r.id: _pulsing(r.heartbeat_at, r.heartbeat_deadline, r.now) for r in found}
        # the silence of the heartbeat that expired: a node's, when its step stopped while the run still beat
        silent = {r.id: _seconds_between(r.node_heartbeat_at if r.cause == "node_heartbeat" else r.heartbeat_at, r.now)
                  for r in found}
        new_owner = _placeholder(p.resume_count + 1) if launching else None
        rows: list[Row[Any]] = []
        for part in chunks(sorted(previous)):
            rows += conn.execute(
                update(pipelines)
                .where(p.id.in_(list(part)), p.status == PipelineStatus.RUNNING)
                .values(owner=new_owner, resumed_from=p.owner, epoch=p.epoch + 1,
                        resume_count=p.resume_count + 1, launcher=launcher if launching else None,
                        **NEW_OWNER_RESETS, heartbeat_at=now,
                        heartbeat_deadline=self.dialect.now_plus(plan.launch_grace_seconds),
                        updated_at=now)
                .returning(p.id, p.job_name, p.params, p.owner, p.epoch, p.resume_count, p.origin_run_id)
            ).all()
        ids = [r.id for r in rows]
        reset = self._reset_running_nodes(conn, ids)
        corrupt = self._corrupt_among(conn, rows)
        reclaimed = [
            Reclaimed(r.id, r.job_name, r.params, previous[r.id], r.owner, r.epoch, r.resume_count,
                      tuple(reset.get(r.id, ())), origin_run_id=r.origin_run_id,
                      owner_heartbeating=heartbeating[r.id],
                      launcher=launcher if launching else None, cause=causes[r.id],
                      heartbeat_age_seconds=silent[r.id])
            for r in rows if r.id not in corrupt
        ]
        self.record_transitions(conn, [
            {"entity_type": "pipeline", "entity_id": r.pipeline_id, "pipeline_id": r.pipeline_id,
             "from_status": PipelineStatus.RUNNING, "to_status": PipelineStatus.RUNNING, "event": "reclaimed",
             "data": {"previous_owner": r.previous_owner, "owner": r.owner, "epoch": r.epoch,
                      "resume_number": r.resume_number, "reason": plan.trigger, "cause": r.cause,
                      "heartbeat_age_seconds": r.heartbeat_age_seconds}}
            for r in reclaimed
        ])
        self.record_events(conn, [
            {"kind": "pipeline_recovered", "pipeline_id": r.pipeline_id,
             "payload": {"previous_owner": r.previous_owner, "resume_number": r.resume_number,
                         "reset_nodes": list(r.reset_nodes), "job": r.job_name, "reason": plan.trigger,
                         "cause": r.cause, "heartbeat_age_seconds": r.heartbeat_age_seconds}}
            for r in reclaimed
        ])
        given_up = self._fail_corrupt(conn, corrupt, previous)
        return reclaimed, given_up

    def claim_awaiting(self, conn: Connection, limit: int | None, grace_seconds: float,
                        scope: Scope) -> list[Reclaimed]:
        ids = [r.id for r in conn.execute(
            select(p.id)
            .where(LIVE, p.status == RUNNING, p.owner.is_(None), p.resume_count > 0,
                   *_jobs(scope.job_names, scope.deployment), *_outside(scope))
            .order_by(p.id).limit(limit).with_for_update(skip_locked=True)
        )]
        if not ids:
            return []
        rows: list[Row[Any]] = []
        for part in chunks(ids):
            rows += conn.execute(
                update(pipelines)
                .where(p.id.in_(list(part)), p.owner.is_(None), p.status == PipelineStatus.RUNNING)
                .values(owner=_placeholder(p.resume_count), launcher=scope.launcher,
                        heartbeat_deadline=self.dialect.now_plus(grace_seconds), updated_at=self.dialect.now())
                .returning(p.id, p.job_name, p.params, p.owner, p.epoch, p.resume_count, p.resumed_from,
                           p.origin_run_id)
            ).all()
        corrupt = self._corrupt_among(conn, rows)
        self._fail_corrupt(conn, corrupt, {r.id: r.resumed_from for r in rows})
        return [Reclaimed(r.id, r.job_name, r.params, r.resumed_from, r.owner, r.epoch, r.resume_count,
                          origin_run_id=r.origin_run_id, launcher=scope.launcher)
                for r in rows if r.id not in corrupt]

    def _reset_running_nodes(self, conn: Connection, pipeline_ids: list[int]) -> dict[int, list[str]]:
        reset: dict[int, list[str]] = {}
        if not pipeline_ids:
            return reset
        rows = conn.execute(
            update(nodes)
            .where(nodes.c.pipeline_id.in_(pipeline_ids), nodes.c.status == NodeStatus.RUNNING)
            .values(status=NodeStatus.PENDING, updated_at=self.dialect.now(), heartbeat_deadline=None,
                    stall_deadline=None, vouched_until=None, died_at=None)
            .returning(nodes.c.id, nodes.c.pipeline_id, nodes.c.name)
        ).all()
        for r in rows:
            reset.setdefault(r.pipeline_id, []).append(r.name)
        self.record_transitions(conn, [
            {"entity_type": "node", "entity_id": r.id, "pipeline_id": r.pipeline_id, "from_status": NodeStatus.RUNNING,
             "to_status": NodeStatus.PENDING, "event": "reset_by_recovery"} for r in rows
        ])
        return reset

    def _corrupt_among(self, conn: Connection, rows: Sequence[Any]) -> dict[int, str]:
        corrupt = {r.id: f"corrupt row: params is not valid JSON ({r.params.error})"
                   for r in rows if isinstance(r.params, CorruptJson)}
        ids = [r.id for r in rows]
        if ids:
            for bad in conn.execute(
                select(nodes.c.pipeline_id, nodes.c.name, nodes.c.status)
                .where(nodes.c.pipeline_id.in_(ids), nodes.c.status.not_in(NODE_STATUSES))
            ):
                corrupt.setdefault(bad.pipeline_id, f"corrupt row: node {bad.name!r} has unknown status {bad.status!r}")
        return corrupt

    def _fail_corrupt(self, conn: Connection, corrupt: dict[int, str], previous: dict[int, Any]) -> list[GivenUp]:
        given_up = []
        for pipeline_id, why in corrupt.items():
            row = conn.execute(
                update(pipelines).where(p.id == pipeline_id)
                .values(status=PipelineStatus.FAILED, gave_up_reason=why, error=why, completed_at=self.dialect.now(),
                        updated_at=self.dialect.now(), heartbeat_deadline=None)
                .returning(p.job_name)
            ).one()
            given_up.append(GivenUp(pipeline_id, row.job_name, previous.get(pipeline_id), why))
        self._record_failed(conn, given_up, "corrupt")
        return given_up

    def corrupt_checks(self) -> list[tuple[ColumnElement[Any], str]]:
        return [(p.status.not_in(PIPELINE_STATUSES), "unknown pipeline status"),
                (self.dialect.not_text(p.owner), "owner is not text"),
                *[(or_(col < 0, col >= MAX_COUNTER), f"{col.name} out of range")
                  for col in (p.epoch, p.resume_count, p.max_resumes)],
                *[(self.dialect.bad_time(col), f"{col.name} is not a finite time")
                  for col in (p.heartbeat_deadline, p.deadline, p.created_at, p.heartbeat_at)],
                # a running node's times decide whether the pipeline is an orphan: one that never
                # expires (or cannot be compared) would keep it running unwatched
                *[(self._running_node_where(self.dialect.bad_time(col)),
                   f"a running node's {col.name} is not a finite time")
                  for col in (nodes.c.heartbeat_deadline, nodes.c.stall_deadline, nodes.c.started_at)],
                (self._running_node_where(or_(nodes.c.attempts < 0, nodes.c.attempts >= MAX_COUNTER)),
                 "a running node's attempts out of range")]

    def fail_unknown_statuses(self, conn: Connection, deployment: str | None = None) -> list[GivenUp]:
        checks = self.corrupt_checks()
        rows = conn.execute(
            select(p.id, p.owner, p.status, p.epoch, *[case((cond, literal(why)), else_=None).label(f"c{i}")
                                                       for i, (cond, why) in enumerate(checks)])
            .where(LIVE, or_(*[cond for cond, _ in checks]), *_jobs(None, deployment))
            .with_for_update(skip_locked=True)
        ).all()
        corrupt = {r.id: "corrupt row: " + "; ".join(
            f"{w} {r.status!r}" if w == "unknown pipeline status" else w for w in r[4:] if w) for r in rows}
        return self._fail_corrupt(conn, corrupt, {r.id: r.owner if isinstance(r.owner, str) else None for r in rows})


    @staticmethod
    def _running_node_where(condition: ColumnElement[Any]) -> ColumnElement[Any]:
        return exists().where(nodes.c.pipeline_id == p.id, nodes.c.status == RUNNING, condition)


def _placeholder(resume_number: ColumnElement[Any]) -> ColumnElement[Any]:
    """``resume-<id>-<n>`` in SQL: the owner a launching reclaim writes (``_conventions.placeholder_owner``)."""
    return literal(PLACEHOLDER_PREFIX) + cast(p.id, Text) + literal("-") + cast(resume_number, Text)


def _jobs(job_names: Sequence[str] | None, deployment: str | None = None) -> list[ColumnElement[Any]]:
    """The pipelines of these jobs in this deployment (``None``: any)."""
    where: list[ColumnElement[Any]] = [] if job_names is None else [p.job_name.in_(list(job_names))]
    return where if deployment is None else [*where, p.deployment == deployment]


def _outside(scope: Scope) -> list[ColumnElement[Any]]:
    """Only the pipelines the scope may act on (see ``Scope.acting_on``)."""
    if scope.acting_on is None:
        return []
    return [or_(p.origin_run_id.is_(None), p.id.in_(list(scope.acting_on)))]


def _pulsing(last_pulse: dt.datetime | None, deadline: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether the owner's run heartbeat was still pulsing at the reclaim: its last pulse is younger than half its
    timeout (less time since it than is left before its deadline). A live worker pulses at least every half
    timeout (the settings refuse a longer interval); one silent for longer is frozen (SIGSTOP, swapped out) or
    gone, even though its deadline has not passed yet, as when a stall deadline shorter than the heartbeat
    timeout expires first. The take-over must not ask such a worker to terminate (see ``stop_superseded``).
    A row without a pulse time (written before it was recorded) counts as pulsing while its deadline holds."""
    if deadline is None:
        return False
    try:
        if last_pulse is None:
            return deadline >= now
        return now - last_pulse < deadline - now
    except (TypeError, OverflowError):  # a time that is not a finite datetime: not known to pulse
        return False


def _seconds_between(earlier: dt.datetime | None, later: dt.datetime | None) -> float | None:
    if earlier is None or later is None:
        return None
    try:
        return round(max((later - earlier).total_seconds(), 0.0), 3)
    except (TypeError, OverflowError):  # a time that is not a finite datetime: reported as unknown
        return None
