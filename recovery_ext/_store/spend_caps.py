"""Spend caps: at most so many tokens, or so much money, per pipeline and per deployment.

A cap is one row of ``rx_spend_caps`` (scope ``pipeline:<id>`` or ``deployment:<name>``) holding the cap,
what was spent (settled) and what is reserved (requests and job submissions under way). A request or a job
submission first reserves its estimate with one conditional UPDATE of each of its caps' rows, in a
transaction fenced by the caller's epoch (the pipeline row share-locked against a reclaim)::

    UPDATE rx_spend_caps SET reserved_tokens = reserved_tokens + :t ...
     WHERE scope = :s AND (max_tokens IS NULL OR spent_tokens + reserved_tokens + :t <= max_tokens) ...

so of many processes asking at once (PostgreSQL re-checks the condition on the row it waited for; SQLite
holds the writer lock), none is granted room another took. The reservation's row is inserted in the same
transaction. The answer's usage moves it from reserved to spent (:meth:`SpendCapAccounts.spend_settle`): the
cap is exceeded by at most what answers cost beyond their estimates. A reservation whose process was
killed stays reserved, the cap never forgetting money that may have been spent, until the ledger says what its
call cost, or that it never left (:meth:`SpendCapAccounts._settle_from_ledger`). A job's reservation carries
the job's token (``ref``) and is settled by whoever collects the job's results (a resume, a take-over).

The configuration (the ``recovery`` resource) sets a cap when its row is first made and whenever the
configuration itself changes; in between, an operator's change (``recovery-ext spend-cap set``) stands. An
operator may also make a cap the configuration does not name: it holds the pipeline (or every pipeline of the
deployment) from its next node start.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, and_, case, delete, func, literal, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._classify.redaction import redact
from recovery_ext._errors import NotFound
from recovery_ext._store.database import Component, Database, Fence, retried
from recovery_ext._store.models import (CapState, Ownership, SpendCaps, SpendGrant, WaitKind, check_cap,
                                       deployment_scope, pipeline_scope)
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.schema import pipelines, provider_calls, provider_jobs, spend_caps, spend_reservations
from recovery_ext._store.statuses import WAITING, PipelineStatus

sc, sr = spend_caps.c, spend_reservations.c

# Float sums of costs: a reservation that fits up to rounding fits.
COST_SLACK = 1e-9


class _NoRoom(Exception):
    """Internal: a cap had no room; the transaction rolls back what the caps before it granted."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.scope = scope


def _fits(tokens: int, cost: float) -> ColumnElement[bool]:
    return and_(or_(sc.max_tokens.is_(None), sc.spent_tokens + sc.reserved_tokens + tokens <= sc.max_tokens),
                or_(sc.max_cost.is_(None), sc.spent_cost + sc.reserved_cost + cost <= sc.max_cost + COST_SLACK))


def _amounts(tokens: int, cost: float | None) -> tuple[int, float]:
    cost = 0.0 if cost is None or not math.isfinite(cost) else max(0.0, float(cost))
    return max(0, int(tokens)), cost


class SpendCapAccounts(Component):
    """The spend caps' accounts (spent, reserved, the limits) and a pipeline paused at a cap or waiting on a
    provider job. Its collaborator: ``fence`` (the pipeline row's lock and epoch check for an owner's
    reservation, in the same transaction)."""

    def __init__(self, db: Database, *, fence: Fence) -> None:
        super().__init__(db)
        self.fence = fence

    @retried
    def spend_configure(self, own: Ownership, caps: SpendCaps) -> list[str]:
        """Make (or bring up to date with a changed configuration) the caps of ``own``'s pipeline; returns their
        scopes in the order reservations take them: the configured ones, and any cap an operator set on the
        pipeline or its deployment (``recovery-ext spend-cap set``) that its configuration does not name."""
        p = pipelines.c
        with self.write() as conn:
            self.fence.check(conn, own)
            deployment = conn.scalar(select(p.deployment).where(p.id == own.pipeline_id)) or ""
            scopes = caps.scopes(own.pipeline_id, deployment)
            for scope, tokens, cost in scopes:
                stmt = self.dialect.insert(spend_caps).values(
                    scope=scope, max_tokens=tokens, max_cost=cost, configured_tokens=tokens, configured_cost=cost,
                    changed_by="configuration", updated_at=self.dialect.now())
                changed = or_(sc.configured_tokens.is_distinct_from(stmt.excluded.configured_tokens),
                              sc.configured_cost.is_distinct_from(stmt.excluded.configured_cost))
                # A row no configuration ever made (a configured one names a limit of at least one kind) was made
                # by an operator's `spend-cap set` before this first look: the operator's limits stand, and the
                # configuration's only fill in a kind the operator left without one, so neither loosens the other.
                operators = and_(sc.configured_tokens.is_(None), sc.configured_cost.is_(None))
                conn.execute(stmt.on_conflict_do_update(index_elements=[sc.scope], set_={
                    "max_tokens": case((operators, func.coalesce(sc.max_tokens, stmt.excluded.max_tokens)),
                                       (changed, stmt.excluded.max_tokens), else_=sc.max_tokens),
                    "max_cost": case((operators, func.coalesce(sc.max_cost, stmt.excluded.max_cost)),
                                     (changed, stmt.excluded.max_cost), else_=sc.max_cost),
                    "changed_by": case((and_(changed, ~operators), stmt.excluded.changed_by), else_=sc.changed_by),
                    "configured_tokens": stmt.excluded.configured_tokens,
                    "configured_cost": stmt.excluded.configured_cost,
                    "updated_at": case((and_(changed, ~operators), stmt.excluded.updated_at),
                                       else_=sc.updated_at)}))
            self._settle_from_ledger(conn, own.pipeline_id)
            # pipeline first, as caps.scopes orders them: every process takes the rows in one order
            ours = [pipeline_scope(own.pipeline_id), deployment_scope(deployment)]
            held = set(conn.scalars(select(sc.scope).where(sc.scope.in_(ours))))
        return [scope for scope in ours if scope in held]

    @retried
    def spend_caps_over(self, pipeline_id: int) -> bool:
        """Whether a cap holds ``pipeline_id`` or its deployment: an operator may set one on a pipeline whose
        configuration has none (one read of two primary keys, at a node's start)."""
        p = pipelines.c
        deployment = select(literal("deployment:") + p.deployment).where(p.id == pipeline_id).scalar_subquery()
        with self.read() as conn:
            return conn.scalar(select(sc.scope).where(or_(sc.scope == pipeline_scope(pipeline_id),
                                                          sc.scope == deployment)).limit(1)) is not None

    def _settle_from_ledger(self, conn: Connection, pipeline_id: int) -> None:
        """Reservations an earlier owner of the pipeline left (a kill, a take-over) whose call the ledger knows
        the outcome of: settled with what the ledger recorded. A call still in flight in the ledger (its answer
        never arrived: the provider may have charged it) stays reserved.

        A reservation that names a call (``ref``) with no ledger row, and no provider job of that token, is
        released: its request never left, since a journaled request's ledger row and a job's intent are written
        before they are sent, each fenced by the owner's epoch, so the earlier owner can write neither any more.
        (A kill between the reservation and that write: tens of requests of an ``amap`` wait there together.)"""
        p = pipelines.c
        earlier = sr.epoch < select(p.epoch).where(p.id == pipeline_id).scalar_subquery()
        never_sent = conn.execute(
            delete(spend_reservations)
            .where(sr.pipeline_id == pipeline_id, earlier, sr.ref.isnot(None),
                   ~select(provider_calls.c.id).where(provider_calls.c.id == sr.ref).exists(),
                   ~select(provider_jobs.c.token).where(provider_jobs.c.pipeline_id == pipeline_id,
                                                        provider_jobs.c.token == sr.ref).exists())
            .returning(sr.scope, sr.tokens, sr.cost)).all()
        self._settle_in(conn, never_sent, 0, 0.0)
        left = conn.execute(
            select(sr.id, sr.scope, sr.tokens, sr.cost, provider_calls.c.tokens_in, provider_calls.c.tokens_out,
                   provider_calls.c.cost.label("spent_cost"), provider_calls.c.outcome)
            .select_from(spend_reservations.join(provider_calls, provider_calls.c.id == sr.ref))
            .where(sr.pipeline_id == pipeline_id, provider_calls.c.outcome != IN_FLIGHT, earlier)).all()
        for row in left:
            if not conn.execute(delete(spend_reservations).where(sr.id == row.id)).rowcount:
                continue
            if row.outcome == "ok":
                self._settle_in(conn, [row], int(row.tokens_in + row.tokens_out), float(row.spent_cost or 0.0))
            elif row.outcome == "timeout":  # it may have been charged: at its estimate, as a live call counts it
                self._settle_in(conn, [row], int(row.tokens), float(row.cost))
            else:  # refused by the provider: nothing was charged
                self._settle_in(conn, [row], 0, 0.0)

    @retried
    def spend_reserve(self, own: Ownership, scopes: Sequence[str], *, tokens: int, cost: float | None = 0.0,
                      ref: str | None = None) -> SpendGrant:
        """Reserve ``tokens`` and ``cost`` under every cap of ``scopes`` (all or none), fenced by ``own``'s epoch;
        or say which cap has no room. ``ref``: the job whose results will settle it (its token)."""
        tokens, cost = _amounts(tokens, cost)
        try:
            with self.write() as conn:
                self.fence.check(conn, own)
                ids = []
                for scope in scopes:
                    took = conn.execute(update(spend_caps).where(sc.scope == scope, _fits(tokens, cost))
                                        .values(reserved_tokens=sc.reserved_tokens + tokens,
                                                reserved_cost=sc.reserved_cost + cost)
                                        .returning(sc.scope)).first()
                    if took is None:
                        raise _NoRoom(scope)
                    ids.append(conn.execute(spend_reservations.insert().values(
                        scope=scope, pipeline_id=own.pipeline_id, epoch=own.epoch, ref=ref, tokens=tokens, cost=cost,
                        reserved_at=self.dialect.now()).returning(sr.id)).scalar_one())
        except _NoRoom as full:
            state = self.spend_cap(full.scope)
            if state is None:
                raise NotFound(f"no spend cap {full.scope!r}: it was deleted while the pipeline ran") from None
            return SpendGrant(full=state)
        return SpendGrant(tuple(ids))

    def _settle_in(self, conn: Connection, rows: Iterable[Any], tokens: int, cost: float) -> None:
        for row in rows:
            # a float sum taken apart again leaves rounding (1.6e-19 of money "reserved" by nothing): under the
            # slack a fit allows, it is 0
            left = sc.reserved_cost - row.cost
            conn.execute(update(spend_caps).where(sc.scope == row.scope).values(
                reserved_tokens=sc.reserved_tokens - row.tokens,
                reserved_cost=case((func.abs(left) < COST_SLACK, 0.0), else_=left),
                spent_tokens=sc.spent_tokens + tokens, spent_cost=sc.spent_cost + cost))

    @retried
    def spend_settle(self, reservations: Sequence[int], *, tokens: int, cost: float | None) -> None:
        """The answer's usage: each reservation leaves ``reserved`` and its cap has spent ``tokens`` and ``cost``.
        A reservation already settled (or released) changes nothing: settling twice never counts twice."""
        tokens, spent = _amounts(tokens, cost)
        with self.write() as conn:
            rows = conn.execute(delete(spend_reservations).where(sr.id.in_(list(reservations)))
                                .returning(sr.scope, sr.tokens, sr.cost)).all()
            self._settle_in(conn, rows, tokens, spent)

    @retried
    def spend_settle_ref(self, ref: str, *, tokens: int, cost: float | None) -> int:
        """Settle every reservation made for the job ``ref`` (whichever process or epoch made it) with what the
        job's results cost; returns how many there were."""
        tokens, spent = _amounts(tokens, cost)
        with self.write() as conn:
            rows = conn.execute(delete(spend_reservations).where(sr.ref == ref)
                                .returning(sr.scope, sr.tokens, sr.cost)).all()
            self._settle_in(conn, rows, tokens, spent)
        return len(rows)

    @retried
    def spend_add(self, scopes: Sequence[str], *, tokens: int, cost: float | None) -> None:
        """More usage of a call already settled (a call recorded in several parts)."""
        tokens, spent = _amounts(tokens, cost)
        with self.write() as conn:
            conn.execute(update(spend_caps).where(sc.scope.in_(list(scopes))).values(
                spent_tokens=sc.spent_tokens + tokens, spent_cost=sc.spent_cost + spent))

    @retried
    def spend_release(self, reservations: Sequence[int]) -> None:
        """The request was never sent (the breaker refused it, the journal answered it): its room comes back."""
        with self.write() as conn:
            rows = conn.execute(delete(spend_reservations).where(sr.id.in_(list(reservations)))
                                .returning(sr.scope, sr.tokens, sr.cost)).all()
            self._settle_in(conn, rows, 0, 0.0)

    # -- reading and changing caps ---------------------------------------------------------------

    @retried
    def spend_cap(self, scope: str) -> CapState | None:
        with self.read() as conn:
            row = conn.execute(select(spend_caps).where(sc.scope == scope)).first()
        return None if row is None else CapState.from_row(row)

    @retried
    def spend_caps(self, scopes: Sequence[str] | None = None) -> list[CapState]:
        """Every cap (or those of ``scopes``), deployments first."""
        query = select(spend_caps).order_by(sc.scope.startswith("pipeline:"), sc.scope)
        if scopes is not None:
            query = query.where(sc.scope.in_(list(scopes)))
        with self.read() as conn:
            return [CapState.from_row(r) for r in conn.execute(query)]

    @retried
    def spend_cap_set(self, scope: str, *, tokens: int | None | bool = False, cost: float | None | bool = False,
                      who: str = "operator") -> CapState:
        """Set a cap, making it if it is not there yet: ``tokens``/``cost`` a new limit, None for no limit of that
        kind, False to leave it (no limit on a new cap). The pipeline (or a pipeline of the deployment) must
        exist: a mistyped id or name is a :class:`NotFound`, not a cap nothing will ever read."""
        values: dict[str, Any] = {"changed_by": redact(who)[:200], "updated_at": self.dialect.now()}
        if tokens is not False:
            check_cap("--tokens", tokens, money=False)
            values["max_tokens"] = tokens
        if cost is not False:
            check_cap("--cost", cost, money=True)
            values["max_cost"] = cost
        with self.write() as conn:
            self._check_scope(conn, scope)
            # one statement whether the cap is new or not: a reservation's conditional UPDATE waits on its row
            # lock, and two operators at once never both insert
            stmt = self.dialect.insert(spend_caps).values(scope=scope, **values)
            row = conn.execute(stmt.on_conflict_do_update(index_elements=[sc.scope], set_=values)
                               .returning(*spend_caps.c)).one()
            self.record_events(conn, [{"kind": "spend_cap_changed", "pipeline_id": _pipeline_of(scope), "payload": {
                "scope": scope, "max_tokens": row.max_tokens, "max_cost": row.max_cost, "by": values["changed_by"]}}])
        return CapState.from_row(row)

    @staticmethod
    def _check_scope(conn: Connection, scope: str) -> None:
        """The pipeline (share-locked: a prune skips it until the cap is written, so no cap outlives its
        pipeline) or the deployment a cap would hold, or :class:`NotFound`."""
        p = pipelines.c
        kind, _, name = scope.partition(":")
        pipeline_id = _pipeline_of(scope)
        if pipeline_id is not None:
            if conn.scalar(select(p.id).where(p.id == pipeline_id).with_for_update(read=True, key_share=True)) is None:
                raise NotFound(f"no pipeline {pipeline_id}")
        elif kind != "deployment" or not name:
            raise NotFound(f"no spend cap {scope!r}: a cap is pipeline:ID or deployment:NAME")
        elif conn.scalar(select(p.id).where(p.deployment == name).limit(1)) is None:
            raise NotFound(f"no deployment {name!r}: no pipeline of it is known (see `recovery-ext pipelines list`)")

    # -- a pipeline paused at its cap, or waiting on a provider job ------------------------------

    @retried
    def show_wait(self, own: Ownership, seconds: float, reason: str, *, kind: WaitKind, node: str | None = None,
                  first: bool = True) -> dt.datetime | None:
        """Show the live pipeline as waiting on ``kind`` (a spend cap, a provider job), its next look ``seconds``
        from now; returns that time (database clock), or None when ``own`` no longer holds the pipeline.
        ``first``: the wait begins (a transition and an event are recorded); later looks only move the next look.
        The outage clock (``waiting_since``) is left alone: this is no outage."""
        reason = f"{kind.value}: {redact(reason)}"[:500]
        p = pipelines.c
        with self.write() as conn:
            row = conn.execute(
                update(pipelines)
                .where(p.id == own.pipeline_id, p.epoch == own.epoch, p.status == PipelineStatus.RUNNING)
                .values(waiting_until=self.dialect.now_plus(seconds), waiting_reason=reason,
                        updated_at=self.dialect.now())
                .returning(p.waiting_until)).first()
            if row is None:
                return None
            if first:
                self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                                "pipeline_id": own.pipeline_id, "from_status": PipelineStatus.RUNNING,
                                                "to_status": WAITING, "event": WAIT_EVENTS[kind][0],
                                                "data": {"reason": reason, "node": node}}])
                self.record_events(conn, [{"kind": "pipeline_waiting", "pipeline_id": own.pipeline_id, "payload": {
                    "reason": reason, "node": node, "waiting_on": kind.value, "seconds": round(seconds, 3),
                    "next_check_at": row.waiting_until.isoformat() if row.waiting_until else None}}])
        waiting_until: dt.datetime | None = row.waiting_until
        return waiting_until

    @retried
    def clear_wait(self, own: Ownership, *, kind: WaitKind, node: str | None = None) -> bool:
        """The wait on ``kind`` is over (a wait of another kind on the pipeline is left alone)."""
        p = pipelines.c
        with self.write() as conn:
            row = conn.execute(
                update(pipelines)
                .where(p.id == own.pipeline_id, p.epoch == own.epoch, p.waiting_reason.startswith(kind.value))
                .values(waiting_until=None, waiting_reason=None, updated_at=self.dialect.now())
                .returning(p.id)).first()
            if row is None:
                return False
            event = WAIT_EVENTS[kind][1]
            self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                            "pipeline_id": own.pipeline_id, "from_status": WAITING,
                                            "to_status": PipelineStatus.RUNNING, "event": event,
                                            "data": {"node": node}}])
            self.record_events(conn, [{"kind": "pipeline_waiting_over", "pipeline_id": own.pipeline_id,
                                       "payload": {"node": node, "outcome": event}}])
        return True


# The transitions a wait records when it begins and when it ends, by what it waits on.
WAIT_EVENTS = {WaitKind.SPEND_CAP: ("spend_cap_wait", "spend_cap_room"),
               WaitKind.PROVIDER_JOB: ("provider_job_wait", "provider_job_ended")}


def _pipeline_of(scope: str) -> int | None:
    kind, _, rest = scope.partition(":")
    return int(rest) if kind == "pipeline" and rest.isdigit() else None
