"""Provider outages in the store: circuit breakers, waiting pipelines and degraded items.

* One **circuit breaker per endpoint** lives in ``rx_circuit_breakers`` and is shared by every
  pipeline of the deployment. Every state change is a conditional ``UPDATE`` on the database clock
  over a row locked first (``FOR UPDATE``; on SQLite the ``BEGIN IMMEDIATE`` writer lock), so of
  many callers exactly one opens it and exactly one takes the half-open probe.
* A pipeline paused by an outage keeps ``status = 'running'`` (fencing, heartbeats and orphan
  detection are unchanged) and gets ``waiting_until``/``waiting_reason``: it is *shown* as waiting.
* An item answered by a fallback is checkpointed ``degraded``; ``reopen_degraded`` hands the nodes
  holding such items to a resume run, which redoes only those items.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Float, func, or_, select, type_coerce, update

from recovery_ext._store.database import Component, Database, Fence, retried
from recovery_ext._errors import IllegalTransition, NotFound
from recovery_ext._store.models import BreakerDecision, Ownership, Reopened, WaitKind
from recovery_ext._classify.redaction import redact
from recovery_ext._store.schema import circuit_breakers, node_items, nodes, pipelines, waiting_shown
from recovery_ext._store.statuses import WAITING, BreakerState, ItemStatus, NodeStatus, PipelineStatus
from recovery_ext._store.node_transitions import NodeTransitions
from recovery_ext._store.pipelines import PipelineCore

cb = circuit_breakers.c


class Outages(Component):
    """The circuit breakers, the outage pause of a pipeline and its degraded items. Its collaborators:
    ``fence`` (the pipeline row's lock and epoch check for a pause's writes, in the same transaction) and
    ``rows`` (the pipeline moves, whose dialect's node steps hold the breaker read that runs before every provider
    call)."""

    def __init__(self, db: Database, *, fence: Fence, rows: PipelineCore) -> None:
        super().__init__(db)
        self.fence = fence
        self.rows = rows

    @property
    def node_steps(self) -> NodeTransitions:
        """The dialect's node steps, chosen on first use as the pipelines' parts choose them, not when the store is
        built (bench/hot_path_bench.py switches the dialect's flags after building its store)."""
        return self.rows.transitions

    def _seconds(self, start: Any, end: Any) -> Any:
        """``end - start`` in seconds as a plain number (on SQLite the difference of two times is not a time)."""
        return type_coerce(self.dialect.seconds_between(start, end), Float)

    # -- circuit breakers ----------------------------------------------------------------------

    @retried
    def breaker_before_call(self, endpoint: str, who: str, *, probe_timeout: float,
                            poll_seconds: float = 2.0) -> BreakerDecision:
        """Closed: call. Open past its cool-down: the first caller becomes the half-open probe. Else wait."""
        now = self.dialect.now()
        row = self._breaker_state(endpoint)
        if row is None or row.state == BreakerState.CLOSED:
            return BreakerDecision(True, BreakerState.CLOSED, failures=row.consecutive_failures if row else 0)
        if row.state == BreakerState.OPEN and row.open_left is not None and float(row.open_left) > 0:
            return BreakerDecision(False, BreakerState.OPEN, wait_seconds=float(row.open_left))
        with self.write() as conn:
            won = conn.execute(
                update(circuit_breakers)
                .where(cb.endpoint == endpoint,
                       ((cb.state == BreakerState.OPEN) & (cb.open_until <= now))
                       | ((cb.state == BreakerState.HALF_OPEN) & (cb.probe_deadline < now)))
                .values(state=BreakerState.HALF_OPEN, probe_owner=who,
                        probe_deadline=self.dialect.now_plus(probe_timeout),
                        updated_at=now)
                .returning(cb.open_count)
            ).first()
            if won is not None:
                self.record_events(conn, [{"kind": "breaker_half_open", "payload": {
                    "endpoint": redact(endpoint), "probe": who, "open_count": won.open_count}}])
                return BreakerDecision(True, BreakerState.HALF_OPEN, probe=True)
        probing = row.state == BreakerState.HALF_OPEN and row.probe_left is not None
        left = float(row.probe_left) if probing else poll_seconds
        return BreakerDecision(False, row.state, wait_seconds=min(max(left, 0.05), poll_seconds))

    def _breaker_state(self, endpoint: str) -> Any:
        """Once per provider call, one round trip: on PostgreSQL a statement prepared once per connection;
        elsewhere a select built once per store (building it cost more than running it)."""
        return self.node_steps.breaker_state(endpoint)

    @retried
    def breaker_record_success(self, endpoint: str, who: str, decision: BreakerDecision) -> bool:
        """The endpoint answered. Only the probe closes an open breaker. Returns whether it closed."""
        if not decision.probe and not decision.failures:
            return False  # the common case writes nothing
        with self.write() as conn:
            if decision.probe:
                closed = conn.execute(
                    update(circuit_breakers)
                    .where(cb.endpoint == endpoint, cb.state == BreakerState.HALF_OPEN, cb.probe_owner == who)
                    .values(state=BreakerState.CLOSED, consecutive_failures=0, open_count=0, open_until=None,
                            probe_owner=None,
                            probe_deadline=None, updated_at=self.dialect.now())
                    .returning(cb.endpoint)
                ).first()
                if closed is not None:
                    self.record_events(conn, [{"kind": "breaker_closed", "payload": {
                        "endpoint": redact(endpoint), "probe": who}}])
                return closed is not None
            conn.execute(update(circuit_breakers).where(cb.endpoint == endpoint, cb.state == BreakerState.CLOSED)
                         .values(consecutive_failures=0, updated_at=self.dialect.now()))
        return False

    @retried
    def breaker_record_failure(self, endpoint: str, who: str, *, threshold: int, cooldown: Any,
                               error: str) -> str | None:
        """A transient failure. Returns ``"opened"`` when this failure opened (or re-opened) the breaker.

        ``cooldown(open_count)`` gives the seconds the breaker stays open the ``open_count``-th time.
        """
        with self.write() as conn:
            conn.execute(self.dialect.insert(circuit_breakers)
                         .values(endpoint=endpoint, state=BreakerState.CLOSED, consecutive_failures=0, open_count=0,
                                 updated_at=self.dialect.now())
                         .on_conflict_do_nothing(index_elements=["endpoint"]))
            row = conn.execute(select(cb.state, cb.consecutive_failures, cb.open_count, cb.probe_owner)
                               .where(cb.endpoint == endpoint).with_for_update()).one()
            error = redact(error)[:500]
            probe_failed = row.state == BreakerState.HALF_OPEN and row.probe_owner == who
            if row.state != BreakerState.CLOSED and not probe_failed:
                return None  # calls in flight when it opened do not count
            failures = row.consecutive_failures + 1
            if not probe_failed and failures < threshold:
                conn.execute(update(circuit_breakers).where(cb.endpoint == endpoint, cb.state == BreakerState.CLOSED)
                             .values(consecutive_failures=failures, last_error=error, updated_at=self.dialect.now()))
                return None
            seconds = float(cooldown(row.open_count + 1))
            opened = conn.execute(
                update(circuit_breakers)
                .where(cb.endpoint == endpoint, cb.state == row.state)
                .values(state=BreakerState.OPEN, consecutive_failures=failures, open_count=row.open_count + 1,
                        opened_at=self.dialect.now(), open_until=self.dialect.now_plus(seconds), probe_owner=None,
                        probe_deadline=None, last_error=error, updated_at=self.dialect.now())
                .returning(cb.open_count)
            ).first()
            if opened is None:
                return None
            self.record_events(conn, [{"kind": "breaker_opened", "payload": {
                "endpoint": redact(endpoint), "consecutive_failures": failures, "open_count": opened.open_count,
                "cooldown_seconds": round(seconds, 3), "after_probe": probe_failed, "error": error}}])
            return "opened"

    @retried
    def breakers(self) -> list[dict[str, Any]]:
        with self.read() as conn:
            rows = conn.execute(select(circuit_breakers).order_by(cb.endpoint)).all()
        return [{**dict(r._mapping), "endpoint": redact(r.endpoint)} for r in rows]

    # -- waiting pipelines -----------------------------------------------------------------------

    @retried
    def set_waiting(self, own: Ownership, seconds: float, reason: str, *, node: str | None = None) -> dt.datetime:
        """Show the pipeline as waiting until ``now + seconds``; returns that time (database clock)."""
        reason = redact(reason)[:500]
        with self.write() as conn:
            self.fence.check(conn, own)
            row = conn.execute(
                update(pipelines)
                .where(pipelines.c.id == own.pipeline_id, pipelines.c.epoch == own.epoch)
                .values(waiting_until=self.dialect.now_plus(seconds), waiting_reason=reason,
                        waiting_since=func.coalesce(pipelines.c.waiting_since, self.dialect.now()),
                        updated_at=self.dialect.now())
                .returning(pipelines.c.waiting_until, pipelines.c.waiting_since)
            ).one()
            self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                            "pipeline_id": own.pipeline_id, "from_status": PipelineStatus.RUNNING,
                                            "to_status": WAITING, "event": "outage_pause",
                                            "data": {"reason": reason, "node": node, "seconds": round(seconds, 3)}}])
            self.record_events(conn, [{"kind": "pipeline_waiting", "pipeline_id": own.pipeline_id, "payload": {
                "reason": reason, "node": node, "seconds": round(seconds, 3),
                "next_try_at": row.waiting_until.isoformat() if row.waiting_until else None}}])
        until: dt.datetime = row.waiting_until
        return until

    @retried
    def clear_waiting(self, own: Ownership, *, node: str | None = None, keep_outage_clock: bool = False,
                      event: str | None = None) -> bool:
        """The pipeline runs again. ``keep_outage_clock``: the outage is not over (the pause ended and the
        call is tried again, or the budget was spent), so ``waiting_since`` stays for the outage budget."""
        values: dict[str, Any] = dict(waiting_until=None, waiting_reason=None, updated_at=self.dialect.now())
        if not keep_outage_clock:
            values["waiting_since"] = None
        with self.write() as conn:
            self.fence.check(conn, own)
            row = conn.execute(
                update(pipelines)
                .where(pipelines.c.id == own.pipeline_id, pipelines.c.epoch == own.epoch,
                       pipelines.c.waiting_until.isnot(None) if keep_outage_clock
                       else or_(pipelines.c.waiting_until.isnot(None), pipelines.c.waiting_since.isnot(None)))
                .values(**values)
                .returning(pipelines.c.id)
            ).first()
            if row is None:
                return False
            event = event or ("outage_continues" if keep_outage_clock else "outage_over")
            self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                            "pipeline_id": own.pipeline_id, "from_status": WAITING,
                                            "to_status": PipelineStatus.RUNNING, "event": event,
                                            "data": {"node": node}}])
            self.record_events(conn, [{"kind": "pipeline_waiting_over", "pipeline_id": own.pipeline_id,
                                       "payload": {"node": node, "outcome": event}}])
        return True

    @retried
    def end_outage_clock(self, own: Ownership, *, node: str | None = None) -> bool:
        """The pipeline's outage is over although no pause of it ended: its clock (``waiting_since``) stops, unless
        an outage pause is shown now (a call or a node sleeps through it: the outage goes on). Another wait shown
        (a rate budget's, a spend cap's, a provider job's) is no outage and does not hold it; nothing shown is
        changed. Returns whether the clock stopped."""
        p = pipelines.c
        other_wait = or_(*(p.waiting_reason.startswith(kind.value) for kind in WaitKind if kind != WaitKind.OUTAGE))
        with self.write() as conn:
            self.fence.check(conn, own)
            row = conn.execute(
                update(pipelines)
                .where(p.id == own.pipeline_id, p.epoch == own.epoch, p.waiting_since.isnot(None),
                       or_(p.waiting_until.is_(None), other_wait))
                .values(waiting_since=None, updated_at=self.dialect.now())
                .returning(pipelines.c.id)
            ).first()
            if row is None:
                return False
            self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                            "pipeline_id": own.pipeline_id, "from_status": PipelineStatus.RUNNING,
                                            "to_status": PipelineStatus.RUNNING, "event": "outage_over",
                                            "data": {"node": node}}])
        return True

    @retried
    def waiting_seconds(self, pipeline_id: int) -> float | None:
        """How long the pipeline has been waiting on an outage (database clock), or None."""
        with self.read() as conn:
            value = conn.scalar(select(self._seconds(pipelines.c.waiting_since, self.dialect.now()))
                                .where(pipelines.c.id == pipeline_id, pipelines.c.waiting_since.isnot(None)))
        return None if value is None else float(value)

    @retried
    def waiting_pipelines(self, *, limit: int = 100) -> list[dict[str, Any]]:
        with self.read() as conn:
            rows = conn.execute(
                select(pipelines.c.id, pipelines.c.job_name, pipelines.c.waiting_until, pipelines.c.waiting_since,
                       pipelines.c.waiting_reason)
                # an orphan (its heartbeat expired: its run is gone) waits for its resume, not for the next try
                # its pause showed, which nobody will make; `status` lists it among the orphans instead
                .where(waiting_shown(self.dialect.now()))
                .order_by(pipelines.c.waiting_until).limit(limit)
            ).all()
        return [dict(r._mapping) for r in rows]

    # -- degraded items --------------------------------------------------------------------------

    @retried
    def degraded_counts(self, pipeline_id: int) -> dict[str, int]:
        with self.read() as conn:
            rows = conn.execute(
                select(node_items.c.node_name, func.count().label("n"))
                .where(node_items.c.pipeline_id == pipeline_id, node_items.c.status == ItemStatus.DEGRADED)
                .group_by(node_items.c.node_name))
            return {r.node_name: r.n for r in rows}

    @retried
    def reopen_degraded(self, pipeline_id: int, node: str | None = None, *, grace_seconds: float = 300.0) -> Reopened:
        """Hand a completed pipeline's nodes with degraded items to a resume run (the orphan sensor launches it).

        In one transaction: the pipeline goes back to ``running`` awaiting a launcher (owner NULL,
        epoch + 1, resume number + 1; the redo does not use up a crash resume), and those nodes to
        ``pending``. The resume run skips every other node and redoes only the degraded items.
        """
        with self.write() as conn:
            p = conn.execute(select(pipelines.c.status, pipelines.c.job_name, pipelines.c.owner)
                             .where(pipelines.c.id == pipeline_id).with_for_update()).first()
            if p is None:
                raise NotFound(f"no pipeline {pipeline_id}")
            counts: dict[str, int] = dict(conn.execute(
                select(node_items.c.node_name, func.count())
                .where(node_items.c.pipeline_id == pipeline_id, node_items.c.status == ItemStatus.DEGRADED,
                       *([node_items.c.node_name == node] if node else []))
                .group_by(node_items.c.node_name)).all())
            if node and not counts:
                exists = conn.scalar(select(nodes.c.id).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == node))
                raise NotFound(f"pipeline {pipeline_id} has no node {node!r}" if exists is None
                               else f"node {node!r} of pipeline {pipeline_id} has no degraded items")
            if not counts:
                return Reopened(pipeline_id, p.job_name, (), 0, 0)
            if p.status != PipelineStatus.COMPLETED:
                raise IllegalTransition(f"pipeline {pipeline_id} is {p.status}; degraded items are redone once it "
                                        "has completed")
            reopened = conn.execute(
                update(nodes)
                .where(nodes.c.pipeline_id == pipeline_id, nodes.c.name.in_(list(counts)),
                       nodes.c.status == NodeStatus.COMPLETED)
                .values(status=NodeStatus.PENDING, updated_at=self.dialect.now(), completed_at=None)
                .returning(nodes.c.id, nodes.c.name)
            ).all()
            row = conn.execute(
                update(pipelines)
                .where(pipelines.c.id == pipeline_id, pipelines.c.status == PipelineStatus.COMPLETED)
                .values(status=PipelineStatus.RUNNING, owner=None, resumed_from=pipelines.c.owner,
                        epoch=pipelines.c.epoch + 1,
                        resume_count=pipelines.c.resume_count + 1, max_resumes=pipelines.c.max_resumes + 1,
                        completed_at=None, error=None, current_node=None, heartbeat_at=self.dialect.now(),
                        heartbeat_deadline=self.dialect.now_plus(grace_seconds), updated_at=self.dialect.now())
                .returning(pipelines.c.resume_count)
            ).one()
            names = tuple(r.name for r in reopened)
            self.record_transitions(conn, [
                {"entity_type": "pipeline", "entity_id": pipeline_id, "pipeline_id": pipeline_id,
                 "from_status": PipelineStatus.COMPLETED, "to_status": PipelineStatus.RUNNING,
                 "event": "reopened_for_degraded",
                 "data": {"nodes": list(names), "items": sum(counts.values())}},
                *({"entity_type": "node", "entity_id": r.id, "pipeline_id": pipeline_id,
                   "from_status": NodeStatus.COMPLETED,
                   "to_status": NodeStatus.PENDING, "event": "reopened_for_degraded",
                   "data": {"degraded_items": counts[r.name]}} for r in reopened),
            ])
            self.record_events(conn, [{"kind": "pipeline_redo_degraded", "pipeline_id": pipeline_id, "payload": {
                "nodes": list(names), "items": sum(counts.values()), "resume_number": row.resume_count}}])
        return Reopened(pipeline_id, p.job_name, names, sum(counts.values()), row.resume_count)
