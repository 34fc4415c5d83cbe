"""A store call frozen past its whole retry budget that comes back to a session the server ended (PostgreSQL).

A worker SIGSTOPped (or a VM paused) inside a store call finds, once it runs again, that its budget was spent
during the freeze and that the server ended its session meanwhile. The call then gets one try on a new session,
and a fenced transaction's body (which cannot be run again) asks a new session's fence before it reports the
loss: a superseded owner is told so (``OwnershipLost``), instead of being told the database is unavailable
without it having been asked. ``tests/process/test_fencing.py`` does the same with a real SIGSTOP.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import Column, Integer, MetaData, Table, Text, func, insert, select, text

from helpers import expire, reclaim
from recovery_ext._errors import OwnershipLost, StoreUnavailable
from recovery_ext._store.models import PassPlan
from recovery_ext._store.store import RecoveryStore

BUDGET = 0.5
meta = MetaData()
writes = Table("lost_session_writes", meta, Column("id", Integer, primary_key=True), Column("what", Text))


@pytest.fixture
def store(pg_url):
    store = RecoveryStore(pg_url, retry_budget=BUDGET)
    store.migrate()
    meta.create_all(store.engine)
    yield store
    store.close()


def end_session_and_freeze(url: str, tx, then=None) -> None:
    """The server ends this transaction's session, and the caller stays away longer than its whole budget."""
    pid = tx.scalar(text("SELECT pg_backend_pid()"))
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 30
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the server did not end the session"
            time.sleep(0.02)
    if then is not None:
        then()
    time.sleep(BUDGET + 0.3)  # the freeze itself: time passing is what this test is about


def rows(store) -> int:
    with store.read() as conn:
        return conn.scalar(select(func.count()).select_from(writes))


def test_the_call_is_tried_once_more_on_a_new_session_and_commits_once(store, pg_url):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1")
    attempts = []

    def work(tx):
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            end_session_and_freeze(pg_url, tx)
        tx.execute(insert(writes).values(what=f"attempt {attempts[-1]}"))

    store.pipelines.write_fenced(own, work)
    assert attempts == [1, 2] and rows(store) == 1


def test_a_superseded_owner_back_from_the_freeze_is_told_it_was_superseded(store, pg_url):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1")
    attempts = []

    def taken_over() -> None:
        expire(store, own.pipeline_id)
        reclaimed, _ = reclaim(store, PassPlan(limit=1, launching=True))
        assert [r.pipeline_id for r in reclaimed] == [own.pipeline_id]

    def work(tx):
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            end_session_and_freeze(pg_url, tx, then=taken_over)
        tx.execute(insert(writes).values(what="zombie"))

    with pytest.raises(OwnershipLost):
        store.pipelines.write_fenced(own, work)
    assert attempts == [1] and rows(store) == 0  # the new session's fence refused before the work ran again


def test_a_session_lost_again_on_the_extra_try_is_reported_unavailable_after_two_attempts(store, pg_url):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1")
    attempts = []

    def work(tx):
        attempts.append(len(attempts) + 1)
        end_session_and_freeze(pg_url, tx)
        tx.execute(insert(writes).values(what="never"))

    with pytest.raises(StoreUnavailable):
        store.pipelines.write_fenced(own, work)
    assert attempts == [1, 2] and rows(store) == 0


def test_a_transaction_body_back_from_the_freeze_is_told_it_was_superseded_not_that_the_database_is_gone(store,
                                                                                                      pg_url):
    """``ctx.transaction()``'s body cannot be run again, so its lost session is reported; a new session's fence
    says first whether the owner was superseded meanwhile."""
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1")

    def taken_over() -> None:
        expire(store, own.pipeline_id)
        reclaim(store, PassPlan(limit=1, launching=True))

    with pytest.raises(OwnershipLost) as raised, store.pipelines.fenced(own) as tx:
        end_session_and_freeze(pg_url, tx, then=taken_over)
        tx.execute(insert(writes).values(what="zombie"))
    assert isinstance(raised.value.__cause__, StoreUnavailable) and rows(store) == 0

    kept = store.pipelines.create_pipeline("job", ["a"], owner="run-2")
    with pytest.raises(StoreUnavailable), store.pipelines.fenced(kept) as tx:  # still the owner: the loss stands
        end_session_and_freeze(pg_url, tx)
        tx.execute(insert(writes).values(what="lost"))
    assert rows(store) == 0
