"""Group commit on both databases: 64 items finishing together are one writer and a few fenced transactions,
never 64 competing writers; a take-over refuses every queued checkpoint; one bad entry fails alone."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, Text, insert, select

from helpers import expire, reclaim, running_node
from recovery_ext._dagster.group_commit import GroupCommitter
from recovery_ext._errors import OwnershipLost
from recovery_ext._store.models import ItemCheckpoint, PassPlan

meta = MetaData()
notes = Table("group_commit_notes", meta, Column("id", Integer, primary_key=True), Column("item", Text))


def committer_for(store, own, transactions: list[int], writers: set[str] | None = None) -> GroupCommitter:
    def commit(entries):
        transactions.append(len(entries))
        if writers is not None:
            writers.add(threading.current_thread().name)
        store.pipelines.checkpoint_items(own, "a", entries)

    return GroupCommitter(commit)


def test_64_items_finishing_together_commit_in_a_few_fenced_transactions(store):
    own = running_node(store)
    batches: list[int] = []
    writers: set[str] = set()
    committer = committer_for(store, own, batches, writers)
    start = threading.Barrier(64)

    def finish(i: int) -> None:
        start.wait()
        committer.submit(ItemCheckpoint(f"k{i:02d}", {"n": i})).result(timeout=60)

    try:
        with ThreadPoolExecutor(64) as pool:
            list(pool.map(finish, range(64)))
    finally:
        committer.close()
    assert sum(batches) == 64
    assert len(batches) < 64  # grouped: fewer transactions than items (the first commit's wait gathers the rest)
    assert writers == {"rx-group-commit"}  # one writer thread, never the 64 item threads
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {f"k{i:02d}": {"n": i} for i in range(64)}


def test_after_a_take_over_every_queued_checkpoint_is_refused_and_nothing_is_written(store):
    meta.create_all(store.engine)
    own = running_node(store)
    committer = committer_for(store, own, [])
    committer.submit(ItemCheckpoint("before")).result(timeout=30)
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1, launching=True))
    futures = [committer.submit(ItemCheckpoint(f"after{i}", also=lambda tx, i=i: tx.execute(
        insert(notes).values(item=f"after{i}")))) for i in range(8)]
    for future in futures:
        with pytest.raises(OwnershipLost):
            future.result(timeout=30)
    committer.close()
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"before": None}
    with store.read() as conn:
        assert list(conn.scalars(select(notes.c.item))) == []


def test_one_refused_entry_fails_alone_and_its_batch_siblings_commit(store):
    meta.create_all(store.engine)
    own = running_node(store)
    gate, entered = threading.Event(), threading.Event()
    batches: list[int] = []

    def commit(entries):
        entered.set()
        gate.wait(30)  # the first batch is held while the next four queue behind it
        batches.append(len(entries))
        store.pipelines.checkpoint_items(own, "a", entries)

    committer = GroupCommitter(commit)

    def broken(tx):
        raise ValueError("this item's side write is refused")

    first = committer.submit(ItemCheckpoint("first"))
    assert entered.wait(30)
    futures = {key: committer.submit(ItemCheckpoint(key, also=broken if key == "bad" else
                                                    (lambda tx, key=key: tx.execute(insert(notes).values(item=key)))))
               for key in ("g1", "bad", "g2", "g3")}
    gate.set()
    first.result(timeout=30)
    for key, future in futures.items():
        if key == "bad":
            with pytest.raises(ValueError, match="side write is refused"):
                future.result(timeout=30)
        else:
            future.result(timeout=30)
    committer.close()
    assert batches == [1, 4, 1, 1, 1, 1]  # the four queued together, refused for one entry, then each on its own
    assert sorted(store.pipelines.completed_items(own.pipeline_id, "a")) == ["first", "g1", "g2", "g3"]
    with store.read() as conn:
        assert sorted(conn.scalars(select(notes.c.item))) == ["g1", "g2", "g3"]


def test_a_waiting_thread_gets_its_own_result_or_refusal(store):
    """``submit_waiting`` (a thread blocking on its commit, as a journal write does) settles each entry as a future
    would: its own result or refusal, its siblings committed; what queued while a commit ran goes in the next."""
    own = running_node(store)
    batches: list[int] = []
    gate, entered = threading.Event(), threading.Event()

    def commit(entries):
        entered.set()
        gate.wait(30)
        batches.append(len(entries))
        store.pipelines.checkpoint_items(own, "a", entries)
        return [ValueError(f"refused {e.key}") if e.key == "w2" else e.key.upper() for e in entries]

    committer = GroupCommitter(commit, max_wait=0.2)
    first = committer.submit_waiting(ItemCheckpoint("w0"))
    assert entered.wait(30)
    waiting = {key: committer.submit_waiting(ItemCheckpoint(key)) for key in ("w1", "w2", "w3")}
    gate.set()
    assert first.result() == "W0"
    assert waiting["w1"].result() == "W1" and waiting["w3"].result() == "W3"
    with pytest.raises(ValueError, match="refused w2"):
        waiting["w2"].result()
    assert waiting["w1"].result() == "W1"  # a settled waiter answers again
    committer.close()
    assert batches == [1, 3]  # the three queued while the first committed went in one transaction
