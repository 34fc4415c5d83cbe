"""Rows that point at a pipeline that is gone (``status``'s dangling rows), on SQLite and PostgreSQL.

A delete of a pipeline that rows still point at notes its id (migration 0024's trigger), with the foreign keys
off too; ``dangling_rows`` looks only at those ids and beyond the first and the last pipeline, never at the
whole history. A prune, which deletes a pipeline's rows before the pipeline, notes nothing.
"""

from __future__ import annotations

import sqlite3

from helpers import migrate_before
from sqlalchemy import delete, select, text

from recovery_ext._store.models import ItemCheckpoint
from recovery_ext._store.schema import deleted_pipelines
from recovery_ext._store.store import RecoveryStore


def with_rows(store: RecoveryStore, run: str, *, holds_item: bool = True):
    """A pipeline with two nodes, an item checkpoint and (``holds_item``) a queue item it holds."""
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner=run, origin_run_id=run)
    store.pipelines.start_node(own, "a")
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", {"r": 1}))
    if holds_item:
        store.queue.enqueue("ocr", [{"run": run}])
        assert store.queue.claim("ocr", run, own=own, heartbeat_timeout=600)
    return own


def delete_by_hand(store: RecoveryStore, db_url: str, pipeline_id: int, *, foreign_keys: bool = False) -> None:
    """A hand-made delete: with the foreign keys off (a plain sqlite3 connection; PostgreSQL's replica role, as a
    restore tool sets it), or on (their cascade takes the nodes and items, not the queue item it held)."""
    if store.dialect.name == "sqlite" and not foreign_keys:
        raw = sqlite3.connect(db_url.removeprefix("sqlite:///"))  # foreign keys are off by default
        raw.execute(f"DELETE FROM rx_pipelines WHERE id = {pipeline_id}")
        raw.commit()
        raw.close()
        return
    with store.engine.begin() as conn:
        if not foreign_keys:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text(f"DELETE FROM rx_pipelines WHERE id = {pipeline_id}"))


def dangling(store: RecoveryStore) -> list[tuple[str, int, int]]:
    return sorted((d["kind"], d["pipeline_id"], d["rows"]) for d in store.reports.dangling_rows())


def noted(store: RecoveryStore) -> list[int]:
    with store.read() as conn:
        return list(conn.scalars(select(deleted_pipelines.c.id).order_by(deleted_pipelines.c.id)))


def test_a_pipeline_deleted_by_hand_between_others_is_noted_and_its_rows_listed(store, db_url):
    first, middle, last = (with_rows(store, f"run-{i}") for i in range(3))
    delete_by_hand(store, db_url, middle.pipeline_id)

    assert noted(store) == [middle.pipeline_id]
    assert dangling(store) == [("item_checkpoint", middle.pipeline_id, 1), ("node", middle.pipeline_id, 2),
                               ("queue_item_holder", middle.pipeline_id, 1)]
    assert store.pipelines.get_pipeline(first.pipeline_id) and store.pipelines.get_pipeline(last.pipeline_id)


def test_a_delete_with_the_foreign_keys_on_leaves_the_queue_item_it_held_and_that_is_listed(store, db_url):
    with_rows(store, "run-0")
    middle = with_rows(store, "run-1")
    with_rows(store, "run-2")
    delete_by_hand(store, db_url, middle.pipeline_id, foreign_keys=True)

    assert dangling(store) == [("queue_item_holder", middle.pipeline_id, 1)]  # nodes and items went by cascade


def test_a_delete_that_leaves_nothing_behind_notes_nothing(store, db_url):
    with_rows(store, "run-0")
    middle = with_rows(store, "run-1", holds_item=False)
    with_rows(store, "run-2")
    delete_by_hand(store, db_url, middle.pipeline_id, foreign_keys=True)

    assert noted(store) == [] and dangling(store) == []


def test_rows_cleaned_up_after_the_delete_are_no_longer_listed_and_the_newest_is_counted_once(store, db_url):
    with_rows(store, "run-0")
    middle = with_rows(store, "run-1")
    newest = with_rows(store, "run-2")
    delete_by_hand(store, db_url, middle.pipeline_id)
    delete_by_hand(store, db_url, newest.pipeline_id)  # noted, and beyond the last pipeline too
    assert noted(store) == [middle.pipeline_id, newest.pipeline_id]
    assert dangling(store) == sorted((kind, pid, rows) for pid in (middle.pipeline_id, newest.pipeline_id)
                                     for kind, rows in (("item_checkpoint", 1), ("node", 2), ("queue_item_holder", 1)))

    with store.write() as conn:  # the operator cleans up the middle one's rows
        for table, column in (("rx_nodes", "pipeline_id"), ("rx_node_items", "pipeline_id"),
                              ("rx_queue_items", "holder_pipeline_id")):
            conn.execute(text(f"DELETE FROM {table} WHERE {column} = {middle.pipeline_id}"))
    assert {pid for _, pid, _ in dangling(store)} == {newest.pipeline_id}


def test_the_migration_notes_what_was_already_left_pointing_at_nothing(db_url):
    from recovery_ext._store.migrations import apply_migrations

    store = RecoveryStore(db_url)
    try:
        migrate_before(store, 24)
        with_rows(store, "run-0")
        middle = with_rows(store, "run-1")
        with_rows(store, "run-2")
        delete_by_hand(store, db_url, middle.pipeline_id)

        assert [m.version for m in apply_migrations(store.engine, store.dialect)][0] == 24

        assert noted(store) == [middle.pipeline_id]
        assert {pid for _, pid, _ in dangling(store)} == {middle.pipeline_id}
    finally:
        store.close()


def test_each_range_is_walked_to_every_pipeline_in_it_with_its_exact_rows_up_to_the_limit(store, db_url):
    """Several gone pipelines in one range (below the first, beyond the last): the walk finds each of them in
    turn, counts each one's rows, and stops at ``limit``."""
    made = [with_rows(store, f"run-{i}") for i in range(6)]
    store.pipelines.checkpoint_item(made[4], "a", ItemCheckpoint("k2", {"r": 2}))  # two items for one of them
    gone = [made[0], made[1], made[4], made[5]]  # the two oldest, the two newest: both open ranges
    for own in gone:
        delete_by_hand(store, db_url, own.pipeline_id)
    with store.write() as conn:  # forgotten: only the ranges beyond the first and the last lead to them now
        conn.execute(delete(deleted_pipelines))

    expected = sorted((kind, own.pipeline_id, rows) for own in gone
                      for kind, rows in (("item_checkpoint", 2 if own is made[4] else 1), ("node", 2),
                                         ("queue_item_holder", 1)))
    assert dangling(store) == expected
    assert len(store.reports.dangling_rows(limit=5)) == 5


def test_postgres_a_delete_above_read_committed_notes_a_running_pipeline_whose_late_items_it_cannot_see(pg_url):
    """PostgreSQL's items have no foreign key (migration 0025): a trigger deletes them with their pipeline. A
    deleter at REPEATABLE READ sees only its snapshot, so an item checkpointed after it began stays behind; the
    delete of a running pipeline notes its id, and ``status`` lists the item."""
    import psycopg

    store = RecoveryStore(pg_url)
    store.migrate()
    try:
        with_rows(store, "run-0", holds_item=False)
        running = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
        store.pipelines.start_node(running, "a")
        with_rows(store, "run-2", holds_item=False)
        with psycopg.connect(pg_url) as deleter:
            deleter.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            deleter.execute("SELECT count(*) FROM rx_node_items").fetchone()  # the snapshot is taken here
            store.pipelines.checkpoint_item(running, "a", ItemCheckpoint("late", {"r": 1}))
            deleter.execute("DELETE FROM rx_pipelines WHERE id = %s", (running.pipeline_id,))
            deleter.commit()

        assert noted(store) == [running.pipeline_id]
        assert dangling(store) == [("item_checkpoint", running.pipeline_id, 1)]
    finally:
        store.close()
