"""The event outbox: newest first with --limit, --follow never skips a committed event, retention, quiet idle ticks."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import insert, select, update

from recovery_ext._cli import main
from recovery_ext import RecoveryResource
from recovery_ext import scan
from recovery_ext._store.models import PassPlan
from recovery_ext._store.models import EventCursor
from recovery_ext._store.schema import events
from recovery_ext._store.store import RecoveryStore


def add_events(store, n, kind="k"):
    with store.write() as conn:
        conn.execute(insert(events).values(created_at=store.dialect.now()),
                     [{"kind": kind, "payload": {"n": i}} for i in range(n)])


def test_limit_shows_the_newest_events(store, db_url):
    add_events(store, 2500)
    ids = [e["id"] for e in store.reports.recent_events(limit=3, newest=True)]
    with store.read() as conn:
        top = conn.scalar(select(events.c.id).order_by(events.c.id.desc()).limit(1))
    assert ids == [top - 2, top - 1, top]
    out = CliRunner().invoke(main, ["--database-url", db_url, "events", "--limit", "3", "--json"])
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["id"] for line in out.output.splitlines()] == ids


def test_follow_shows_an_event_that_commits_after_a_higher_id(pg_url):
    store = RecoveryStore(pg_url, retry_budget=0)
    store.migrate()
    add_events(store, 2)
    shown, cursor = store.reports.start_following(limit=10)
    assert len(shown) == 2
    slow = store.engine.connect()
    slow_tx = slow.begin()
    slow.execute(insert(events).values(kind="late", payload={}, created_at=store.dialect.now()))  # takes id 3
    store.record_event("early")                                                                # id 4, commits first
    seen = [e["kind"] for e in store.reports.follow_events(cursor)]
    assert seen == ["early"]
    for _ in range(3):
        assert store.reports.follow_events(cursor) == []  # the gap waits while its transaction is open
    slow_tx.commit()
    slow.close()
    assert [e["kind"] for e in store.reports.follow_events(cursor)] == ["late"]
    store.record_event("after")
    assert [e["kind"] for e in store.reports.follow_events(cursor)] == ["after"]
    for _ in range(3):
        store.reports.follow_events(cursor)
    assert cursor.gaps == {}  # closed once every transaction that could fill it ended
    store.close()


def test_a_rolled_back_gap_is_dropped_once_its_transaction_ended():
    cursor = EventCursor()
    assert cursor.advance([1, 3], xmin=10, xmax=12) == {1, 3}
    assert cursor.gaps == {2: None}
    cursor.advance([], xmin=11, xmax=15)   # noted: wait until every transaction below xid 15 ended
    cursor.advance([], xmin=14, xmax=16)
    assert 2 in cursor.gaps
    cursor.advance([], xmin=15, xmax=16)
    assert cursor.gaps == {}


def test_retention_deletes_only_old_events_and_the_sensor_setting_is_bounded(store):
    add_events(store, 5, kind="old")
    with store.write() as conn:
        conn.execute(update(events).values(created_at=store.dialect.now_plus(-40 * 86400)))
    add_events(store, 3, kind="new")
    assert store.reports.prune_events(30 * 86400) == 5
    assert {e["kind"] for e in store.reports.recent_events(limit=100)} == {"new"}
    resource = RecoveryResource(database_url=str(store.engine.url), event_retention_seconds=7200)
    assert resource.enforce_event_retention(store) == 0


def test_an_idle_scan_records_no_event(store):
    for _ in range(3):
        stats = scan(store, PassPlan(trigger="sensor"))
        assert stats.error is None and stats.found == 0
    assert store.reports.recent_events(limit=100) == []
