"""Which Dagster instance may act on a pipeline: the one that holds its first run.

A deployment name says which instance's sensor owns a pipeline, but two instances may share a name
by accident, and a deployment may be renamed. So before a tick acts on a pipeline it asks its own
Dagster instance whether it holds the pipeline's first run (``origin_run_id``):

* a pipeline of this deployment whose first run this instance does not hold is another instance's:
  the tick stands aside (no reclaim, no give-up, no resume request) and says why;
* an orphan of another deployment whose first run this instance holds was this instance's before a
  rename: it is adopted into this deployment and resumed; so is such a pipeline already reclaimed for a
  resume run (by ``recovery-ext recover``), whose resume only its deployment's sensor would request;
* an orphan of another deployment that nobody reclaims (its deployment's sensor is gone) is reported
  in the tick and in ``recovery-ext status``, never left silently.

Here are the reads; the Dagster questions are asked by the sensor (``RunControl.known_runs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, or_, select
from collections.abc import Callable
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._store.database import Component, retried
from recovery_ext._store.models import LEGACY_DEPLOYMENT, Scope
from recovery_ext._store.orphans import _placeholder
from recovery_ext._store.schema import pipelines
from recovery_ext._store.statuses import PipelineStatus

p = pipelines.c

FIRST_RUNS_LIMIT = 10_000   # pipelines a tick checks against its Dagster instance at most (a mass kill's worth)
STRANDED_AFTER = 600.0      # seconds an orphan may go unreclaimed before status calls it stranded


@dataclass(frozen=True)
class ForeignOrphan:
    """An orphan of another deployment, in this sensor's jobs."""

    pipeline_id: int
    deployment: str
    origin_run_id: str
    stale: bool   # orphaned longer than the launch grace: its own deployment's sensor is not reclaiming it


@dataclass(frozen=True)
class FirstRun:
    """A live pipeline of this deployment and its first run, which the tick's instance must hold to act on it."""

    pipeline_id: int
    origin_run_id: str
    actionable: bool  # an orphan by the database clock, or reserved for a resume run: a tick would act on it


class Deployments(Component):
    def first_runs_to_check(self, conn: Connection, scope: Scope, grace_seconds: float,
                            orphan_condition: Callable[..., ColumnElement[bool]],
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
        actionable = or_(orphan_condition((), scope.job_names, (), scope.deployment), reserved)
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
            .where(or_(orphan_condition((), scope.job_names, (), None), reserved_any), p.origin_run_id.isnot(None),
                   p.deployment.not_in([scope.deployment, LEGACY_DEPLOYMENT]))
            .order_by(p.id).limit(FIRST_RUNS_LIMIT))]
        return first, foreign

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
