"""Helpers shared by the tests."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager

import psycopg
from psycopg import pq
from sqlalchemy import event

from recovery_ext._store import hot_path
from recovery_ext._store.store import RecoveryStore


def expire(store: RecoveryStore, pipeline_id: int, *, column: str = "heartbeat_deadline", ago: float = 5.0) -> None:
    """Move a deadline into the past on the database clock (no sleeping)."""
    from sqlalchemy import update

    from recovery_ext._store.schema import pipelines

    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id)
                     .values({column: store.dialect.now_plus(-ago)}))


@contextmanager
def round_trips(store):
    """The protocol messages the store's connections send and receive meanwhile (libpq trace)."""
    trace = tempfile.TemporaryFile("w+")  # noqa: SIM115 - libpq writes to its descriptor while the block runs

    def on_checkout(dbapi_conn, *_):
        dbapi_conn.pgconn.trace(trace.fileno())
        dbapi_conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def on_checkin(dbapi_conn, *_):
        if dbapi_conn is not None and not dbapi_conn.closed:  # an invalidated connection has nothing to untrace
            dbapi_conn.pgconn.untrace()

    messages: list[str] = []
    event.listen(store.engine.pool, "checkout", on_checkout)
    event.listen(store.engine.pool, "checkin", on_checkin)
    # the hot path's kept connection goes back to the pool: its next statement checks it out (traced) and keeps
    # it; released again before the listeners go, so it is untraced before the trace file closes
    store._db.kept.release()
    try:
        yield messages
    finally:
        store._db.kept.release()
        event.remove(store.engine.pool, "checkout", on_checkout)
        event.remove(store.engine.pool, "checkin", on_checkin)
        trace.seek(0)
        for line in trace:  # "F\t88\tBind\t ..." -> "F Bind ..."
            if not line.startswith(("F\t", "B\t")):
                continue  # the rest of a multi-line query text in a Parse message
            direction, _length, *rest = line.rstrip("\n").split("\t")
            messages.append(" ".join([direction, *(part.strip() for part in rest)]).strip())
        trace.close()


def sent_round_trips(messages: list[str]) -> list[str]:
    """The messages of a libpq trace that end a round trip: Sync (extended protocol) or a simple Query."""
    return [m.split()[1] for m in messages if m.startswith("F") and m.split()[1] in ("Sync", "Query")]


def running_node(store: RecoveryStore, *, stall_timeout: float | None = None):
    """The ownership of a new pipeline of job ``job`` (owner ``run-1``) whose one node, ``a``, is running."""
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1")
    store.pipelines.start_node(own, "a", stall_timeout=stall_timeout)
    return own


def reclaim(store: RecoveryStore, plan, scope=None):
    """``(reclaimed, failed as corrupt)`` of one recovery pass: the path the orphan sensor and ``recover`` take."""
    from recovery_ext._store.models import Scope

    result = store.recovery.recovery_pass(plan, Scope() if scope is None else scope)
    return result.reclaimed, result.corrupt


def reclaim_until_taken(store: RecoveryStore, plan, *, before=None, what: str = "the reclaim"):
    """The pipelines a recovery pass reclaimed, passing again (after ``before()``, e.g. an expiry) until one
    reclaims any: what the orphan sensor does tick after tick. One pass can rightly take nothing: it skips a
    pipeline row that a live heartbeat, a fenced write or a just-killed worker's backend holds at that instant
    (``FOR UPDATE SKIP LOCKED``), and a live heartbeat can push an expired deadline forward again."""
    from recovery_pipelines.devserver import wait_for

    def one_pass():
        if before is not None:
            before()
        return reclaim(store, plan)[0]

    return wait_for(one_pass, timeout=30, interval=0.05, what=what)


def drop_answers_once(monkeypatch, *queries: str) -> list[str]:
    """Each of the prepared ``queries`` (hot_path: one-row statements and many-row ones alike) runs and commits on
    the server once, then its connection drops before the answer arrives, as a network cut would; the names of
    those dropped, in order."""
    dropped: list[str] = []

    def dropping_once(run_for_real):
        def drop_once(raw, query, params):
            rows = run_for_real(raw, query, params)  # the server ran and committed it
            if query in queries and query not in dropped:
                dropped.append(query)
                raw.close()  # the answer is lost with the connection
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return rows

        return drop_once

    monkeypatch.setattr(hot_path, "_row", dropping_once(hot_path._row))
    monkeypatch.setattr(hot_path, "_rows", dropping_once(hot_path._rows))
    return dropped


def migrate_before(store: RecoveryStore, version: int) -> None:
    """The database as it was before migration ``version``: every earlier one applied and recorded, that one not."""
    from recovery_ext._store.migrations import load_migrations
    from recovery_ext._store.schema import migrations_table

    with store.engine.begin() as conn:
        migrations_table.create(conn)
        for m in load_migrations(store.dialect):
            if m.version < version:
                for statement in m.statements():
                    conn.exec_driver_sql(statement)
                conn.execute(migrations_table.insert().values(version=m.version, name=m.name,
                                                              applied_at=store.dialect.now()))


def incompressible_key(size: int, *, seed: int = 7) -> str:
    """An item key of ``size`` random ASCII letters and digits: a long key PostgreSQL cannot compress into an
    index entry, as a long URL or file path would be, the same in every run."""
    import random
    import string

    return "".join(random.Random(seed).choices(string.ascii_letters + string.digits, k=size))
