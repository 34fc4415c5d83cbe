"""Request and token budgets per provider endpoint (optionally per model), shared by every process.

A provider enforces requests per minute (RPM) and tokens per minute (TPM) over a sliding window.
Each call reserves one request and its estimated tokens in ``rx_rate_reservations`` before it is
sent; the response's ``usage`` then corrects the reservation to what was really spent. A
reservation is granted only when the window still holds room for it. A reservation holds its room
from the moment it is made until one window (plus a small margin for clock differences) after its
request was answered: the provider counted the request when it arrived, at some moment between the
two, however long the request took to get there. So what the provider counts in any window never
exceeds its quota, on a busy machine too.

Concurrency: a reservation first locks the budget's row (an upsert: ``ON CONFLICT DO UPDATE``
locks the existing row on PostgreSQL; ``BEGIN IMMEDIATE`` is the writer lock on SQLite), then reads
the database clock, counts the window and inserts, all in one transaction. So of many processes
asking at once, each sees the others' reservations, and none is granted the same room twice.
Reservations older than the window are deleted by the next reservation of the same budget.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, case, delete, func, or_, select, type_coerce, update
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._classify.redaction import redact
from recovery_ext._errors import ConfigurationError
from recovery_ext._store.database import Component, retried
from recovery_ext._store.models import BudgetGrant, Ownership, ProviderLimits
from recovery_ext._store.dialects import DbTime
from recovery_ext._store.schema import pipelines, rate_budgets, rate_reservations
from recovery_ext._store.statuses import WAITING, PipelineStatus

rr = rate_reservations.c

# A pipeline waiting for budget shows this reason prefix, so clearing it never clears an outage's pause.
BUDGET_REASON = "rate budget"


class RateBudgets(Component):
    """The request and token budgets per endpoint, and a pipeline shown waiting for one (its own rows only:
    no collaborators)."""

    def _clock_now(self) -> ColumnElement[dt.datetime]:
        """The database clock now (not at the transaction's start: the lock may have been waited for)."""
        return type_coerce(self.dialect.statement_clock(), DbTime)

    def _clock(self, conn: Connection) -> dt.datetime:
        now: dt.datetime = conn.execute(select(self._clock_now())).scalar_one()
        return now

    @retried
    def budget_reserve(self, endpoint: str, model: str | None, *, tokens: int, limits: ProviderLimits,
                       holder: str | None = None, own: Ownership | None = None) -> BudgetGrant:
        """Reserve one request and ``tokens`` in the budget of ``endpoint`` (and of ``model`` when
        ``limits.per_model``, else of the whole endpoint), or say how long until the window has room.
        The limits are the caller's configuration; the row keeps the last ones given, for reports.

        ``own``: the pipeline the request is made for. Unanswered, the reservation then counts until that
        owner is superseded or the pipeline ends, and one window from then (see :func:`_holding`)."""
        requests_per_minute, tokens_per_minute = limits.requests_per_minute, limits.tokens_per_minute
        window_seconds = limits.window_seconds
        if tokens_per_minute is not None and tokens > tokens_per_minute:
            raise ConfigurationError(f"a call estimated at {tokens} tokens can never fit tokens_per_minute="
                                     f"{tokens_per_minute}; raise the limit or lower the call's max tokens")
        key = (redact(endpoint)[:500], (model if limits.per_model else None) or "")
        span = float(window_seconds) + float(limits.margin)
        with self.write() as conn:
            stmt = self.dialect.insert(rate_budgets).values(
                endpoint=key[0], model=key[1], requests_per_minute=requests_per_minute,
                tokens_per_minute=tokens_per_minute, window_seconds=float(window_seconds),
                updated_at=self.dialect.now())
            conn.execute(stmt.on_conflict_do_update(
                index_elements=[rate_budgets.c.endpoint, rate_budgets.c.model],
                set_={"requests_per_minute": requests_per_minute, "tokens_per_minute": tokens_per_minute,
                      "window_seconds": float(window_seconds), "updated_at": self.dialect.now()}))
            now = self._clock(conn)
            backoff_until = conn.execute(select(rate_budgets.c.backoff_until).where(
                rate_budgets.c.endpoint == key[0], rate_budgets.c.model == key[1])).scalar_one()
            if backoff_until is not None and backoff_until > now:  # a 429 made everybody back off
                return BudgetGrant(False, wait_seconds=max((backoff_until - now).total_seconds(), 0.001),
                                   backing_off=True)
            mine = (rr.endpoint == key[0]) & (rr.model == key[1])
            holding = _holding(now, span)
            conn.execute(delete(rate_reservations).where(mine, ~holding))
            # what the window holds, summed by the database: a budget far from its limit grants on that alone. Its
            # rows are read only when it is full, to say when room comes (a budget of 10,000 requests a minute
            # read and sorted every reservation of its window for each request: 0.2x the throughput of no budget)
            held, spent = conn.execute(select(func.count(), func.coalesce(func.sum(rr.tokens), 0))
                                       .where(mine, holding)).one()
            count, spent = int(held), int(spent)
            if not _has_room(count, spent, requests_per_minute, tokens_per_minute, tokens):
                window = conn.execute(select(rr.reserved_at, rr.answered_at, rr.tokens).where(mine, holding)
                                      .order_by(rr.reserved_at, rr.id)).all()
                wait = _wait_for_room(window, now, span, requests_per_minute, tokens_per_minute, tokens)
                return BudgetGrant(False, wait_seconds=wait, requests_in_window=count, tokens_in_window=spent)
            reservation = conn.execute(rate_reservations.insert().values(
                endpoint=key[0], model=key[1], holder=holder, tokens=int(tokens), reserved_at=now,
                pipeline_id=None if own is None else own.pipeline_id, epoch=None if own is None else own.epoch)
                .returning(rr.id)).scalar_one()
        return BudgetGrant(True, reservation, requests_in_window=count + 1, tokens_in_window=spent + tokens)

    @retried
    def budget_back_off(self, endpoint: str, model: str | None, *, limits: ProviderLimits,
                        retry_after: float | None = None, max_delay: float | None = None) -> float:
        """The provider answered 429: nobody reserves from this budget for a while, in any process. The
        while is ``retry_after`` when the provider said it, else half a second doubled per 429 in a row (a
        429 more than one window after the last back-off ended starts again); at most ``max_delay`` (the
        caller's configured cap on a Retry-After, ``LLMResource.max_delay``) and at most one window.
        Returns the seconds the budget now stays closed.

        Several callers with different caps: each 429 closes the budget for what the caller that got it
        may honour (its own cap), and a back-off in force is never shortened by a later, shorter one. A
        caller with a shorter cap may so wait up to the longest cap among the callers that got a 429, never
        longer (and never past the window): the provider refused the endpoint's shared key, not one caller,
        and sending into that refusal early only earns everybody another 429. An absurd Retry-After (hours,
        negative, not a number, a date long past or far ahead) thus never closes the endpoint for longer
        than a cap somebody configured."""
        key = (redact(endpoint)[:500], (model if limits.per_model else None) or "")
        b = rate_budgets.c
        mine = (b.endpoint == key[0]) & (b.model == key[1])
        with self.write() as conn:
            # the row's lock first (the reservation takes it the same way), then the clock
            conn.execute(update(rate_budgets).where(mine).values(updated_at=self.dialect.now()))
            row = conn.execute(select(b.backoff_until, b.backoff_streak).where(mine)).first()
            if row is None:  # no reservation ever made the row: nothing to hold back
                return 0.0
            now = self._clock(conn)
            recent = row.backoff_until is not None and (now - row.backoff_until).total_seconds() < limits.window_seconds
            streak = (row.backoff_streak if recent else 0) + 1
            seconds = _back_off_seconds(retry_after, streak, limits.window_seconds, max_delay)
            # ``now`` is the database clock read under the row's lock, so no other back-off came in between;
            # the later of the two deadlines is kept in the same statement that writes the new one
            until = bindparam(None, now + dt.timedelta(seconds=seconds), type_=DbTime)
            kept: dt.datetime = conn.execute(
                update(rate_budgets).where(mine)
                .values(backoff_until=case((b.backoff_until > until, b.backoff_until), else_=until),
                        backoff_streak=streak)
                .returning(b.backoff_until)).scalar_one()
        return max((kept - now).total_seconds(), 0.0)

    @retried
    def budget_settle(self, reservation: int, tokens: int) -> None:
        """The response's usage: the reservation now holds what the call really spent."""
        with self.write() as conn:
            conn.execute(update(rate_reservations).where(rr.id == reservation).values(tokens=max(0, int(tokens))))

    @retried
    def budget_answered(self, reservation: int) -> None:
        """The reserved request got its answer (or failed): from now its room is held one window more, also
        when its holder was superseded meanwhile (then the provider may have counted it later than that)."""
        now = self._clock_now()
        with self.write() as conn:
            conn.execute(update(rate_reservations)
                         .where(rr.id == reservation, or_(rr.answered_at.is_(None), rr.answered_at < now))
                         .values(answered_at=now))

    @retried
    def budget_release(self, reservation: int) -> None:
        """The reserved request was never sent (the breaker refused it): the window gets its room back."""
        with self.write() as conn:
            conn.execute(delete(rate_reservations).where(rr.id == reservation))

    # -- a pipeline waiting for budget ---------------------------------------------------------------

    @retried
    def show_budget_wait(self, own: Ownership, seconds: float, reason: str, *, node: str | None = None) -> bool:
        """Show the (live) pipeline as waiting for budget until ``now + seconds``; an outage's pause is left alone.
        Not fenced beyond its own condition: a superseded owner's wait changes nothing."""
        reason = f"{BUDGET_REASON}: {redact(reason)}"[:500]
        p = pipelines.c
        with self.write() as conn:
            row = conn.execute(
                update(pipelines)
                .where(p.id == own.pipeline_id, p.epoch == own.epoch, p.status == PipelineStatus.RUNNING,
                       (p.waiting_until.is_(None)) | p.waiting_reason.startswith(BUDGET_REASON))
                .values(waiting_until=self.dialect.now_plus(seconds), waiting_reason=reason,
                        updated_at=self.dialect.now())
                .returning(p.id)).first()
            if row is None:
                return False
            self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                            "pipeline_id": own.pipeline_id, "from_status": PipelineStatus.RUNNING,
                                            "to_status": WAITING, "event": "budget_wait",
                                            "data": {"reason": reason, "node": node, "seconds": round(seconds, 3)}}])
        return True

    @retried
    def clear_budget_wait(self, own: Ownership, *, node: str | None = None) -> bool:
        p = pipelines.c
        with self.write() as conn:
            row = conn.execute(
                update(pipelines)
                .where(p.id == own.pipeline_id, p.epoch == own.epoch, p.waiting_reason.startswith(BUDGET_REASON))
                .values(waiting_until=None, waiting_reason=None, updated_at=self.dialect.now())
                .returning(p.id)).first()
            if row is None:
                return False
            self.record_transitions(conn, [{"entity_type": "pipeline", "entity_id": own.pipeline_id,
                                            "pipeline_id": own.pipeline_id, "from_status": WAITING,
                                            "to_status": PipelineStatus.RUNNING, "event": "budget_granted",
                                            "data": {"node": node}}])
        return True


# A reservation made outside any pipeline and never answered (its process died mid-call) stops holding room
# after this many windows: nothing else can tell that its holder is gone. A pipeline's reservation is let go
# by the reclaim that supersedes its holder (migration 0021), and counts until then.
IN_FLIGHT_WINDOWS = 5


def _back_off_seconds(retry_after: float | None, streak: int, window_seconds: float,
                      max_delay: float | None) -> float:
    """How long a 429 closes the budget: what it asked for (else half a second doubled per 429 in a row), never
    negative and never more than the caller's cap or one window. A value that is not a finite number (a header
    read wrong) counts as asking nothing."""
    seconds = 0.5 * 2.0 ** min(streak - 1, 16)
    if retry_after is not None and math.isfinite(retry_after):
        seconds = max(float(retry_after), 0.0)
    cap = float(window_seconds)
    if max_delay is not None and math.isfinite(max_delay):
        cap = min(cap, max(float(max_delay), 0.0))
    return min(seconds, cap)


def _holding(now: dt.datetime, span: float) -> ColumnElement[bool]:
    """A reservation holds room in the window while its request is in flight, and for ``span`` seconds after
    its answer: the provider counted it at its arrival, somewhere between its reservation and its answer. A
    pipeline's reservation is in flight until answered, or until its holder is superseded or its pipeline ends,
    which stands for its answer (a trigger sets ``answered_at`` then)."""
    unbounded = rr.pipeline_id.isnot(None) | (rr.reserved_at > now - dt.timedelta(seconds=IN_FLIGHT_WINDOWS * span))
    return or_(rr.answered_at > now - dt.timedelta(seconds=span), rr.answered_at.is_(None) & unbounded)


def _leaves(reservation: Any, span: float) -> tuple[dt.datetime, bool]:
    """When a reservation stops holding room, and whether that is only a bound (still in flight)."""
    if reservation.answered_at is not None:
        return reservation.answered_at + dt.timedelta(seconds=span), False
    return reservation.reserved_at + dt.timedelta(seconds=IN_FLIGHT_WINDOWS * span), True


def _has_room(count: int, spent: int, requests_per_minute: int | None, tokens_per_minute: int | None,
              tokens: int) -> bool:
    """Whether a window holding ``count`` requests and ``spent`` tokens has room for one more of ``tokens`` (what
    :func:`_wait_for_room` says 0 to)."""
    return (requests_per_minute is None or count < requests_per_minute) and \
        (tokens_per_minute is None or spent + tokens <= tokens_per_minute)


def _wait_for_room(window: Sequence[Any], now: dt.datetime, span: float, requests_per_minute: int | None,
                   tokens_per_minute: int | None, tokens: int) -> float:
    """Seconds until the window has room for one more request of ``tokens``; 0 when it has now. A request
    still in flight may be answered any moment: waiting on one is asked again after a short poll."""
    window = sorted(window, key=lambda r: _leaves(r, span)[0])
    drop = 0  # how many of the first reservations to leave must leave the window first
    if requests_per_minute is not None:
        drop = max(drop, len(window) - requests_per_minute + 1)
    if tokens_per_minute is not None:
        spent = sum(int(r.tokens) for r in window)
        freed, needed = 0, 0
        while needed < len(window) and spent - freed + tokens > tokens_per_minute:
            freed += int(window[needed].tokens)
            needed += 1
        drop = max(drop, needed)
    if drop <= 0:
        return 0.0
    leaves, in_flight = _leaves(window[drop - 1], span)
    wait = max((leaves - now).total_seconds(), 0.001)
    return min(wait, max(0.05, span / 20)) if in_flight else wait
