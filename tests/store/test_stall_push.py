"""A node's stall deadline moves only when less than its stall timeout is left (``pipelines.stall_push``).

Every path that pushes it keeps the same rule, on both databases: a one-item checkpoint, a batch, an item
that keeps a provider call, a degraded item redone, and ``ctx.progress()`` (``report_progress``). After any
of them the deadline is at least a stall timeout away; when it already was, the node's row is not rewritten.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Float, select, text, type_coerce, update

from recovery_ext._store.models import ErrorInfo, ProviderCall
from recovery_ext._store.pipelines import STALL_PUSH_SLACK, ItemCheckpoint
from recovery_ext._store.schema import nodes

STALL = 600.0


def _running_node(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1")
    store.pipelines.start_node(own, "a", stall_timeout=STALL)
    return own


def _set_deadline(store, own, seconds_from_now: float | None) -> dt.datetime | None:
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == "a").values(
            stall_deadline=None if seconds_from_now is None else store.dialect.now_plus(seconds_from_now)))
    return _deadline(store, own)


def _deadline(store, own) -> dt.datetime | None:
    return store.pipelines.get_node(own.pipeline_id, "a").stall_deadline


def _row_writes(store, own):
    """What changes whenever the node's row is written: PostgreSQL's xmin of it; on SQLite (no xmin) a count kept
    by a trigger this test adds to its own database file."""
    with store.write() as conn:
        if store.dialect.name == "postgresql":
            return conn.scalar(text("SELECT xmin::text FROM rx_nodes WHERE pipeline_id = :p AND name = 'a'"),
                               {"p": own.pipeline_id})
        conn.execute(text("CREATE TABLE IF NOT EXISTS node_writes (n INTEGER NOT NULL)"))
        conn.execute(text("CREATE TRIGGER IF NOT EXISTS node_written AFTER UPDATE ON rx_nodes "
                          "BEGIN INSERT INTO node_writes VALUES (1); END"))
        return conn.scalar(text("SELECT count(*) FROM node_writes"))


def _seconds_left(store, own) -> float:
    """The node's stall deadline less the database's clock now."""
    with store.read() as conn:
        left = type_coerce(store.dialect.seconds_between(store.dialect.now(), nodes.c.stall_deadline), Float)
        return float(conn.scalar(select(left).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == "a")))


def _pushes(store, own):
    """Every way an item's progress pushes the stall deadline, each with a fresh item."""
    made = iter(range(1000))

    def degraded_redone() -> None:
        key = f"degraded-{next(made)}"
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(key, None, "degraded"))  # no stall: no push
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(key, {"v": 4}), stall_timeout=STALL)

    return {
        "one item": lambda: store.pipelines.checkpoint_item(
            own, "a", ItemCheckpoint(f"one-{next(made)}", {"v": 1}), stall_timeout=STALL),
        "a batch": lambda: store.pipelines.checkpoint_items(
            own, "a", [ItemCheckpoint(f"batch-{next(made)}", 1), ItemCheckpoint(f"batch-{next(made)}", 2)],
            stall_timeout=STALL),
        "an item keeping a call": lambda: store.pipelines.checkpoint_item(
            own, "a", ItemCheckpoint(f"call-{next(made)}", 3, calls=[
                ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=3, tokens_out=1)]),
            stall_timeout=STALL),
        "a degraded item redone": degraded_redone,
        "ctx.progress()": lambda: store.pipelines.report_progress(own, "a", stall_timeout=STALL),
    }


def test_progress_leaves_a_deadline_at_least_a_stall_timeout_away_as_it_is_and_its_row_unwritten(store):
    own = _running_node(store)
    _row_writes(store, own)
    for way, push in _pushes(store, own).items():
        kept = _set_deadline(store, own, STALL + 50)
        written = _row_writes(store, own)
        push()
        assert _deadline(store, own) == kept, way
        assert _row_writes(store, own) == written, way


@pytest.mark.parametrize("left", [STALL - 1, 5.0, -30.0, None], ids=["just-under", "nearly-due", "past", "none"])
def test_progress_moves_a_nearer_deadline_a_tenth_past_the_stall_timeout(store, left):
    own = _running_node(store)
    pushed_to = STALL * (1 + STALL_PUSH_SLACK)
    for way, push in _pushes(store, own).items():
        _set_deadline(store, own, left)
        push()
        # on the database's clock: the push's now is at most the test's few statements ago
        assert pushed_to - 5 < _seconds_left(store, own) <= pushed_to + 0.01, way


def test_a_node_started_again_with_a_smaller_stall_timeout_is_due_by_it_not_by_the_pushed_deadline(store):
    """A pushed deadline stays until less than the stall timeout is left: the node's next start (a resume run's,
    whatever its settings) sets it anew from its own stall timeout, never keeps the old one."""
    own = _running_node(store)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("pushed", 1), stall_timeout=STALL)
    store.pipelines.report_progress(own, "a", stall_timeout=STALL)
    assert _seconds_left(store, own) > STALL  # pushed a tenth past it
    store.pipelines.fail_node(own, "a", ErrorInfo(message="the worker died", category="crash"), permanent=False)
    store.pipelines.start_node(own, "a", stall_timeout=60)
    assert 55 < _seconds_left(store, own) <= 60.01
    store.pipelines.report_progress(own, "a", stall_timeout=60)  # less than 60 s left: pushed to 66 s
    assert 65 < _seconds_left(store, own) <= 66.01


def test_a_node_is_never_due_sooner_than_its_stall_timeout_after_progress(store):
    """The invariant the rule keeps, whatever the deadline was (this one holds with the old rule too)."""
    own = _running_node(store)
    pushes = _pushes(store, own)
    for left in (STALL + 50, STALL - 1, 0.0, None):
        for way, push in pushes.items():
            _set_deadline(store, own, left)
            push()
            assert _seconds_left(store, own) > STALL - 5, (left, way)


@pytest.fixture
def node_writes(store):
    """How many times rx_nodes' rows were written since the test began: a counting trigger, dropped after (the
    PostgreSQL database is lent to the next test)."""
    postgres = store.dialect.name == "postgresql"
    with store.write() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS node_writes (n INTEGER NOT NULL)"))
        if postgres:
            conn.execute(text("CREATE FUNCTION node_written() RETURNS trigger LANGUAGE plpgsql AS "
                              "$$ BEGIN INSERT INTO node_writes VALUES (1); RETURN NULL; END $$"))
            conn.execute(text("CREATE TRIGGER node_written AFTER UPDATE ON rx_nodes FOR EACH ROW "
                              "EXECUTE FUNCTION node_written()"))
        else:
            conn.execute(text("CREATE TRIGGER IF NOT EXISTS node_written AFTER UPDATE ON rx_nodes "
                              "BEGIN INSERT INTO node_writes VALUES (1); END"))

    def count() -> int:
        with store.read() as conn:
            return int(conn.scalar(text("SELECT count(*) FROM node_writes")))

    try:
        yield count
    finally:
        with store.write() as conn:
            conn.execute(text("DROP TRIGGER IF EXISTS node_written" + (" ON rx_nodes" if postgres else "")))
            if postgres:
                conn.execute(text("DROP FUNCTION IF EXISTS node_written()"))
            conn.execute(text("DROP TABLE node_writes"))


def test_items_in_flight_in_many_threads_move_the_deadline_once(store, node_writes):
    """Eight threads checkpoint and report progress at once on one node whose deadline is missing: the first push
    moves it, and every other one, waiting on the row or reading it after, finds it a stall timeout away."""
    own = _running_node(store)
    _set_deadline(store, own, None)
    written = node_writes()

    def work(thread: int) -> None:
        for i in range(25):
            if i % 5 == 4:
                store.pipelines.report_progress(own, "a", stall_timeout=STALL)
            else:
                store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(f"t{thread}-{i}", i), stall_timeout=STALL)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    assert len(store.pipelines.completed_items(own.pipeline_id, "a")) == 8 * 20
    assert node_writes() - written == 1
    assert STALL * (1 + STALL_PUSH_SLACK) - 30 < _seconds_left(store, own) <= STALL * (1 + STALL_PUSH_SLACK) + 0.01
