"""What the process that knows says about the step processes it watches.

A step process records on its running node which process it is and which process watches it
(:mod:`recovery_ext._processes`). The watcher (the run worker, or a Celery worker's main
process) reads the running nodes it watches, looks each process up, and writes back in one
transaction: ``vouched_until`` for the live ones, ``died_at`` for the dead ones. Each write names
the node by id *and* process key and requires it still running under the run that started it
(the pipeline's owner), so a node restarted since, or a pipeline reclaimed since, is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import exists, func, select, tuple_, update

from recovery_ext._store.database import Component, chunks, retried
from recovery_ext._store.models import Ownership, WatchedNode
from recovery_ext._store.pipelines import NEW_OWNER_RESETS
from recovery_ext._store.schema import nodes, pipelines
from recovery_ext._store.statuses import NodeStatus, PipelineStatus

n = nodes.c


@dataclass(frozen=True)
class SlowNode:
    """A running node whose own heartbeat expired while its watcher still vouches for its process."""

    pipeline_id: int
    name: str
    process: str | None
    heartbeat_deadline: object
    vouched_until: object


class Vouching(Component):
    """What a watcher says about the step processes it watches, and a run worker leaving its pipeline to
    recovery (a part of ``store.pipelines``): its own rows only, no collaborator."""

    @retried
    def watched_nodes(self, watcher: str) -> list[WatchedNode]:
        """The running nodes whose step process ``watcher`` watches (and has not yet reported dead)."""
        with self.read_statement() as conn:
            rows = conn.execute(
                select(n.id, n.pipeline_id, n.name, n.process)
                .where(n.status == NodeStatus.RUNNING, n.watcher == watcher, n.process.isnot(None),
                       n.died_at.is_(None))
                .order_by(n.id))
            return [WatchedNode(r.id, r.pipeline_id, r.name, r.process) for r in rows]

    @retried
    def vouch_nodes(self, watcher: str, alive: Sequence[WatchedNode], dead: Sequence[WatchedNode],
                    timeout: float) -> int:
        """Vouch for the live processes' nodes; report the dead ones' nodes dead now.

        A vouch lasts as long as the node's own heartbeat span (``timeout`` for a node without one),
        so when its watcher dies too, the node is found within about the timeout it was set up with.
        Returns how many node rows were written.
        """
        now = self.dialect.now()
        span = func.coalesce(self.dialect.seconds_between(n.heartbeat_at, n.heartbeat_deadline), float(timeout))
        held = exists().where(pipelines.c.id == n.pipeline_id, pipelines.c.status == PipelineStatus.RUNNING,
                              pipelines.c.owner == n.run_id)
        written = 0
        with self.write() as conn:
            for found, values in ((alive, {"vouched_until": self.dialect.now_plus(span)}),
                                  (dead, {"died_at": now, "vouched_until": None})):
                for part in chunks(sorted((w.id, w.process) for w in found)):
                    written += conn.execute(
                        update(nodes)
                        .where(n.status == NodeStatus.RUNNING, n.watcher == watcher, n.died_at.is_(None),
                               tuple_(n.id, n.process).in_(list(part)), held)
                        .values(**values)).rowcount
        return written

    @retried
    def leave_to_recovery(self, own: Ownership) -> bool:
        """The run worker ends a run whose step process died: its pipeline is an orphan now, not after the
        heartbeat timeout (fenced: only while it is still ``own``'s). Returns whether it was.

        A pause shown on it (``waiting``, a next try) ends in the same statement: nobody is left to try again,
        so it awaits its resume, not a next try that would pass and stay on show. The reclaim that follows
        clears the same columns, so recovery is unchanged."""
        with self.write() as conn:
            return bool(conn.execute(
                update(pipelines)
                .where(pipelines.c.id == own.pipeline_id, pipelines.c.epoch == own.epoch,
                       pipelines.c.owner == own.owner, pipelines.c.status == PipelineStatus.RUNNING)
                .values(heartbeat_deadline=self.dialect.now_plus(-0.001), **NEW_OWNER_RESETS)).rowcount)
