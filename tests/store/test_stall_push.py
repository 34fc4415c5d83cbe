"""A node's stall deadline moves only when less than its stall timeout is left (``pipelines.stall_push``).

Every path that pushes it keeps the same rule, on both databases: a one-item checkpoint, a batch, an item
that keeps a provider call, a degraded item redone, and ``ctx.progress()`` (``report_progress``). After any
of them the deadline is at least a stall timeout away; when it already was, the node's row is not rewritten.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select, text, update

from recovery_ext._store.models import ProviderCall
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


def _row_version(store, own) -> str | None:
    """PostgreSQL's xmin of the node's row: it changes with every UPDATE that writes the row. SQLite has none."""
    if store.dialect.name != "postgresql":
        return None
    with store.read() as conn:
        return conn.scalar(text("SELECT xmin::text FROM rx_nodes WHERE pipeline_id = :p AND name = 'a'"),
                           {"p": own.pipeline_id})


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
    for way, push in _pushes(store, own).items():
        kept = _set_deadline(store, own, STALL + 50)
        version = _row_version(store, own)
        push()
        assert _deadline(store, own) == kept, way
        assert _row_version(store, own) == version, way


@pytest.mark.parametrize("left", [STALL - 1, 5.0, -30.0, None], ids=["just-under", "nearly-due", "past", "none"])
def test_progress_moves_a_nearer_deadline_a_tenth_past_the_stall_timeout(store, left):
    own = _running_node(store)
    for way, push in _pushes(store, own).items():
        _set_deadline(store, own, left)
        before = dt.datetime.now(dt.UTC)
        push()
        after = dt.datetime.now(dt.UTC)
        deadline = _deadline(store, own)
        assert deadline is not None, way
        # the database clock is this machine's: a push at a moment between before and after
        assert (deadline - before).total_seconds() >= STALL * (1 + STALL_PUSH_SLACK) - 1, way
        assert (deadline - after).total_seconds() <= STALL * (1 + STALL_PUSH_SLACK) + 1, way


def test_a_node_is_never_found_stalled_sooner_than_its_stall_timeout_after_progress(store):
    """The invariant the rule keeps: whatever the deadline was, progress leaves it a stall timeout away."""
    own = _running_node(store)
    pushes = _pushes(store, own)
    for left in (STALL + 50, STALL - 1, 0.0, None):
        for way, push in pushes.items():
            _set_deadline(store, own, left)
            push()
            with store.read() as conn:
                away = conn.scalar(select(nodes.c.stall_deadline >= store.dialect.now_plus(STALL - 1)).where(
                    nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == "a"))
            assert away, (left, way)
