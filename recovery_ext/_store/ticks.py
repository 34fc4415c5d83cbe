"""The orphan sensor's two transactions: one read of what to ask the orchestrator, one write of the outcome.

An idle tick is the read alone. Everything a tick decides (cancel, extend reservations, fail corrupt
rows, give up, reclaim, reserve what the CLI reclaimed, record the pass) commits in one transaction,
so a tick never leaves half its decisions behind and costs the database two round trips of
transactions however many steps it has.

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

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, exists, or_, select, update

from recovery_ext._store.database import Component, Database, chunks, retried
from recovery_ext._store.models import (LEGACY_DEPLOYMENT, FirstRun, ForeignOrphan, Orphan, PassPlan, PassResult,
                                        Scope, TickSnapshot)
from recovery_ext._store.orphans import LIVE, RUNNING, Orphans, _jobs, _placeholder
from recovery_ext._store.pipelines import PipelineCore
from recovery_ext._store.schema import pipelines, waiting_shown
from recovery_ext._store.statuses import PipelineStatus

p = pipelines.c

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
