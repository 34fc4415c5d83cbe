"""Item checkpoints at the speed of the database: batches, one-statement checkpoints, dropped connections.

- a batch that fails mid-way is redone once and only once: its results, ``also=`` writes and
  checkpoints commit together or not at all (PostgreSQL and SQLite);
- a per-item checkpoint on PostgreSQL is one statement; a connection the server killed between
  two checkpoints is replaced by the store's retry (no pool pre-ping).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from dagster import Field, in_process_executor, job
from sqlalchemy import Column, Integer, MetaData, Table, Text, func, insert, select

from helpers import reclaim, round_trips, running_node, sent_round_trips
from recovery_ext._errors import IllegalTransition, OwnershipLost, StoreUnavailable
from recovery_ext import RecoveryResource, execute_in_process, recoverable_op
from recovery_ext._dagster.executor import with_recovery
from recovery_ext._store.models import PassPlan, ProviderCall
from recovery_ext._store.pipelines import ItemCheckpoint
from recovery_ext._store.checkpoints import Checkpoints
from recovery_ext._store.schema import node_items
from recovery_ext._store.store import RecoveryStore
import store_rows

HERE = Path(__file__).resolve().parent  # the batch worker imports this module
meta = MetaData()
side_effects = Table("batch_side_effects", meta, Column("id", Integer, primary_key=True), Column("item", Text))
KEYS = [f"k{i}" for i in range(10)]
BODY_CALLS: Counter = Counter()
SEEN_AT_RETRY: list[set[str]] = []


@recoverable_op(config_schema={"batch": Field(int, default_value=4), "fail_at": Field(str, default_value="k6")})
def batched(ctx):
    attempt = ctx.context.retry_number
    if attempt:
        SEEN_AT_RETRY.append(set(ctx.completed_items()))
    for item in ctx.items(KEYS, batch=ctx.op_config["batch"]):
        BODY_CALLS[item.key] += 1
        if item.key == ctx.op_config["fail_at"] and attempt == 0:
            raise ConnectionResetError("the provider dropped the connection")  # transient: Dagster retries the op
        item.complete({"n": item.key}, also=lambda tx, key=item.key: tx.execute(insert(side_effects).values(item=key)))
    return sorted(ctx.completed_items())


@job(executor_def=with_recovery(in_process_executor))
def batched_job():
    batched()


def _run(db_url: str, **config):
    resource = RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=5, max_retries=2,
                                retry_initial_delay=0.01, retry_max_delay=0.02)
    return execute_in_process(batched_job, run_config={"ops": {"batched": {"config": config}}},
                              resources={"recovery": resource}, raise_on_error=False)


def _side_effect_rows(store) -> list[str]:
    with store.read() as conn:
        return list(conn.scalars(select(side_effects.c.item).order_by(side_effects.c.id)))


def test_a_batch_that_fails_midway_is_redone_once_and_only_once(store, db_url):
    meta.create_all(store.engine)
    BODY_CALLS.clear()
    SEEN_AT_RETRY.clear()
    result = _run(db_url, batch=4, fail_at="k6")
    assert result.success
    # batch 1 (k0-k3) committed; batch 2 (k4-k7) failed at k6 before its flush: nothing of it was kept
    assert [{"k0", "k1", "k2", "k3"}] == SEEN_AT_RETRY
    assert {**{k: 1 for k in KEYS}, "k4": 2, "k5": 2, "k6": 2} == BODY_CALLS
    assert result.output_for_node("batched") == sorted(KEYS)
    rows = _side_effect_rows(store)
    assert sorted(rows) == sorted(KEYS) and len(rows) == len(set(rows))  # every also= write exactly once
    (p,) = store.reports.list_pipelines()
    assert p.status == "completed"
    with store.read() as conn:
        assert conn.scalar(select(func.count()).select_from(node_items).where(node_items.c.pipeline_id == p.id)) == 10


def test_batched_completions_are_flushed_when_the_keys_run_out_and_flush_seconds_zero_flushes_each(store, db_url):
    meta.create_all(store.engine)
    BODY_CALLS.clear()
    result = _run(db_url, batch=1000, fail_at="none")
    assert result.success and result.output_for_node("batched") == sorted(KEYS)
    assert sorted(_side_effect_rows(store)) == sorted(KEYS)


# -- the store API -------------------------------------------------------------------------------


def test_a_batch_commits_all_or_nothing_and_redoes_degraded_items(store):
    meta.create_all(store.engine)
    own = running_node(store)

    def note(key):
        return lambda tx: tx.execute(insert(side_effects).values(item=key))

    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("x", 1, "completed", note("x")),
                                      ItemCheckpoint("y", None, "degraded", note("y"))])
    with pytest.raises(IllegalTransition, match="'x'.*already checkpointed"):
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("z", 3, also=note("z")), ItemCheckpoint("x", 9)])
    assert _side_effect_rows(store) == ["x", "y"]  # z's write rolled back with its batch
    store.pipelines.checkpoint_items(
        own, "a", [ItemCheckpoint("y", 2), ItemCheckpoint("z", 3)]
    )  # a fallback answer is redone
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"x": 1, "y": 2, "z": 3}
    assert store_rows.item_statuses(store, own.pipeline_id, "a") == {
        "x": "completed",
        "y": "completed",
        "z": "completed",
    }
    with pytest.raises(IllegalTransition, match="twice"):
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("w"), ItemCheckpoint("w")])


def test_one_item_alone_redoes_a_fallback_refuses_a_completed_item_and_pushes_the_stall_deadline(store, monkeypatch):
    """One item that keeps no provider call goes by the single-item statement on PostgreSQL; what it
    decides must be what a batch decides."""
    statements: list[str] = []
    run_statement = Checkpoints._checkpoint_statement

    def noted(self, raw, params, *, commit=False, query="checkpoint_items"):
        statements.append(query)
        return run_statement(self, raw, params, commit=commit, query=query)

    monkeypatch.setattr(Checkpoints, "_checkpoint_statement", noted)
    own = running_node(store)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("done", {"v": 1}))
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("fallback", None, "degraded"))
    assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is None
    with pytest.raises(IllegalTransition, match="'done'.*already checkpointed"):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("done", {"v": 2}))
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("fallback", {"v": 3}), stall_timeout=30)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"done": {"v": 1}, "fallback": {"v": 3}}
    assert store_rows.item_statuses(store, own.pipeline_id, "a") == {"done": "completed", "fallback": "completed"}
    assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is not None
    call = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=3, tokens_out=1)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("with-call", 4, calls=[call]))
    rows = store_rows.provider_calls(store, own.pipeline_id)
    assert [(r.item_key, r.tokens_in) for r in rows] == [("with-call", 3)]
    assert store_rows.reached_checkpoint(store, [call.id]) == {call.id: True}
    pushed_before = store.pipelines.get_node(own.pipeline_id, "a").stall_deadline
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("pushed", 8), stall_timeout=3600)
    assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline > pushed_before
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("p1", {"v": 5}), ItemCheckpoint("p2", None)])
    with pytest.raises(IllegalTransition, match="'done'.*already checkpointed"):  # one old key refuses the batch
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("p3", 6), ItemCheckpoint("done", 7)])
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {
        "done": {"v": 1}, "fallback": {"v": 3}, "with-call": 4, "pushed": 8, "p1": {"v": 5}, "p2": None}
    # PostgreSQL's statements (SQLite writes rows on its driver): scalars for a new item alone (with the stall
    # deadline's CTE when it pushes one), the full batch statement once an item has a row, the ledger's CTE for an
    # item that keeps a call, and new items without either as the plain batch INSERT
    assert statements == ([] if not store.dialect.dml_in_cte else [
        "checkpoint_new_item", "checkpoint_new_item", "checkpoint_new_item", "checkpoint_items",
        "checkpoint_new_item_stall", "checkpoint_items", "checkpoint_new_items", "checkpoint_new_item_stall",
        "checkpoint_new_items_plain", "checkpoint_new_items_plain", "checkpoint_items"])


def test_a_superseded_owner_writes_no_batch_and_no_single_checkpoint(store):
    meta.create_all(store.engine)
    own = running_node(store)
    from helpers import expire

    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1, launching=True))
    with pytest.raises(OwnershipLost):
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("x", also=lambda tx: tx.execute(
            insert(side_effects).values(item="x")))])
    with pytest.raises(OwnershipLost):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("y"), stall_timeout=30)
    with pytest.raises(OwnershipLost):  # alone, without a stall push: PostgreSQL's plain INSERT ... SELECT
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("z", {"v": 1}))
    with pytest.raises(OwnershipLost):  # new items without calls or a stall push: the plain batch INSERT
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("p1", 1), ItemCheckpoint("p2", 2)])
    assert _side_effect_rows(store) == [] and store.pipelines.completed_items(own.pipeline_id, "a") == {}


def test_a_batched_loop_taken_over_midway_keeps_its_flushed_batch_and_writes_nothing_after(store):
    """A buffered completion is not checked on its own: the flush that follows it is fenced, so the batch a
    superseded owner filled is refused whole, and the next item stops before it starts."""
    from dagster import DagsterInstance, build_op_context

    from helpers import expire
    from recovery_ext._dagster.context import NodeContext
    from recovery_ext._liveness.heartbeat import HeartbeatSettings

    own = running_node(store)
    started: list[str] = []
    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        with pytest.raises(OwnershipLost):
            for item in ctx.items([f"k{i}" for i in range(8)], batch=3):
                started.append(item.key)
                if item.key == "k4":  # k0-k2 flushed; k3 buffered: another run takes the pipeline over now
                    expire(store, own.pipeline_id)
                    (taken,), _ = reclaim(store, PassPlan(limit=1, launching=True))
                    assert taken.pipeline_id == own.pipeline_id and taken.epoch > own.epoch
                item.complete({"n": item.key})  # k3, k4 buffer without a check; k5 fills the batch: its flush fails
    assert started == ["k0", "k1", "k2", "k3", "k4", "k5"]
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {f"k{i}": {"n": f"k{i}"} for i in range(3)}
    assert (ctx.items_done, ctx._pending) == (3, {})


@pytest.mark.parametrize("stall_timeout", [None, 30], ids=["no-stall", "stall-push"])
def test_the_calls_a_batch_keeps_reach_the_ledger_column_for_column_with_their_own_items(store, stall_timeout):
    """PostgreSQL binds a checkpoint's calls as one JSON array of objects (_checkpoint_calls.sql): every column
    of every call arrives as it was made, with the item it was made for."""
    own = running_node(store)
    made = {
        'say "hi"': [ProviderCall(endpoint="http://127.0.0.1:9/v1", model='gpt "quoted" é', tokens_in=2**31 + 5,
                                  tokens_out=0, latency_seconds=0.125, cost=None, note="line\nnew 😀")],
        "é": [ProviderCall(endpoint="http://127.0.0.1:9/v2", model=None, tokens_in=1, tokens_out=2,
                           latency_seconds=1e-6, cost=0.0003, outcome="rate_limit"),
              ProviderCall(endpoint="http://127.0.0.1:9/v3", model="m", tokens_in=3, tokens_out=4, latency_seconds=2.5,
                           cost=12.5, note="back\\slash \\u0000")],
        "no calls": [],
    }
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint(key, key, calls=tuple(calls)) for key, calls in
                                                made.items()], stall_timeout=stall_timeout)
    columns = ("endpoint", "model", "tokens_in", "tokens_out", "latency_seconds", "outcome", "cost", "note")
    written = {call.id: call for call in store_rows.provider_calls(store, own.pipeline_id)}
    assert {call_id: (call.item_key, *(getattr(call, c) for c in columns)) for call_id, call in written.items()} \
        == {call.id: (key, *(getattr(call, c) for c in columns)) for key, calls in made.items() for call in calls}
    assert store_rows.reached_checkpoint(store, list(written)) == {
        call.id: call.outcome == "ok" for calls in made.values() for call in calls}
    assert {(call.run_id, call.epoch) for call in written.values()} == {(own.owner, own.epoch)}


@pytest.mark.parametrize("with_also", [False, True], ids=["one-statement", "with-also"])
def test_a_batch_naming_a_completed_key_writes_nothing(store, with_also):
    meta.create_all(store.engine)
    own = running_node(store)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("done", 1))
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("fallback", "old", status="degraded"))
    also = (lambda tx: tx.execute(insert(side_effects).values(item="x"))) if with_also else None
    with pytest.raises(IllegalTransition, match="'done'.*already checkpointed"):
        store.pipelines.checkpoint_items(
            own,
            "a",
            [
                ItemCheckpoint("new1", 1, also=also),
                ItemCheckpoint("fallback", "new"),
                ItemCheckpoint("done", 2),
                ItemCheckpoint("new2", 3),
            ],
            stall_timeout=30,
        )
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"done": 1, "fallback": "old"}
    assert store_rows.item_statuses(store, own.pipeline_id, "a") == {"done": "completed", "fallback": "degraded"}
    assert _side_effect_rows(store) == []
    assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is None  # the stall push went with the batch


def test_a_superseded_epoch_writes_no_checkpoint_on_any_path(store):
    meta.create_all(store.engine)
    own = running_node(store)
    from helpers import expire

    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1, launching=True))
    writes = [
        lambda: store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("single", 1), stall_timeout=30),
        lambda: store.pipelines.checkpoint_items(
            own, "a", [ItemCheckpoint("b1"), ItemCheckpoint("b2")], stall_timeout=30
        ),
        lambda: store.pipelines.checkpoint_items(
            own, "a", [ItemCheckpoint("b3", also=lambda tx: tx.execute(insert(side_effects).values(item="b3")))]
        ),
    ]
    for write in writes:
        with pytest.raises(OwnershipLost):
            write()
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {} and _side_effect_rows(store) == []
    node = store.pipelines.get_node(own.pipeline_id, "a")
    assert node.status == "pending" and node.stall_deadline is None


def test_a_batch_with_also_commits_its_writes_and_checkpoints_together_or_not_at_all(store):
    meta.create_all(store.engine)
    own = running_node(store)

    def note(key):
        return lambda tx: tx.execute(insert(side_effects).values(item=key))

    def boom(tx):
        raise RuntimeError("the side effect failed")

    with pytest.raises(RuntimeError, match="side effect failed"):
        store.pipelines.checkpoint_items(
            own, "a", [ItemCheckpoint("a1", 1, also=note("a1")), ItemCheckpoint("a2", 2, also=boom)]
        )
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {} and _side_effect_rows(store) == []
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("a1", 1, also=note("a1")), ItemCheckpoint("a2", 2),
                                      ItemCheckpoint("a3", 3, also=note("a3"))], stall_timeout=30)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"a1": 1, "a2": 2, "a3": 3}
    assert _side_effect_rows(store) == ["a1", "a3"]
    assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is not None


def test_a_checkpoint_without_also_is_one_round_trip_on_postgresql(pg_url):
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = running_node(store)
        store.pipelines.checkpoint_item(
            own, "a", ItemCheckpoint("warm", 0), stall_timeout=30
        )  # psycopg prepares on first use
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("warm1"), ItemCheckpoint("warm2")], stall_timeout=30)
        for write in (
            lambda: store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", {"v": 1}), stall_timeout=30),
            lambda: store.pipelines.checkpoint_items(
                own, "a", [ItemCheckpoint(f"b{i}", i) for i in range(100)], stall_timeout=30
            ),
        ):
            with round_trips(store) as messages:
                write()
            sent = [m for m in messages if m.startswith("F")]
            # one Sync (one round trip), no simple Query (BEGIN/COMMIT), idle (committed) afterwards
            assert [m.split()[1] for m in sent if m.split()[1] in ("Sync", "Query")] == ["Sync"], messages
            assert messages[-1] == "B ReadyForQuery I", messages
        assert len(store.pipelines.completed_items(own.pipeline_id, "a")) == 104
        assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is not None
    finally:
        store.close()


def test_a_checkpoint_with_also_writes_sends_its_commit_in_the_same_round_trip_on_postgresql(pg_url):
    """BEGIN, the caller's write, then the checkpoint statement and COMMIT under one Sync: the
    statement's fence fails a superseded owner's statement, so the server skips that COMMIT
    (test_a_reclaim_between_the_also_writes_and_the_checkpoint_rolls_the_writes_back)."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        meta.create_all(store.engine)
        own = running_node(store)

        def note(key):
            return lambda tx: tx.execute(insert(side_effects).values(item=key))

        store.pipelines.checkpoint_item(
            own, "a", ItemCheckpoint("warm", 0, also=note("warm"))
        )  # psycopg prepares on first use
        with round_trips(store) as messages:
            store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", {"v": 1}, also=note("k1")), stall_timeout=30)
        sent = [m.split()[1] for m in messages if m.startswith("F")]
        assert sent_round_trips(messages) == ["Query", "Sync", "Sync"], messages  # BEGIN, the write, both
        last_sync = len(sent) - 1 - sent[::-1].index("Sync")
        previous_sync = last_sync - 1 - sent[last_sync - 1::-1].index("Sync")
        assert sent[previous_sync + 1:last_sync].count("Execute") == 2, messages  # the checkpoint and COMMIT
        assert messages[-1] == "B ReadyForQuery I", messages  # committed: nothing left for the pool's reset
        assert store.pipelines.completed_items(own.pipeline_id, "a") == {"warm": 0, "k1": {"v": 1}}
        assert _side_effect_rows(store) == ["warm", "k1"]
        assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is not None
    finally:
        store.close()


def _terminate_other_backends(pg_url: str) -> int:
    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        return conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> "
            "pg_backend_pid()", (dbname,)).fetchone()[0]


def test_a_connection_killed_between_checkpoints_is_replaced_by_a_retry(pg_url, caplog):
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = running_node(store)
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1))
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("k2", 2)])
        for write in (
            lambda: store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k3", 3)),
            lambda: store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("k4", 4), ItemCheckpoint("k5", 5)]),
        ):
            assert _terminate_other_backends(pg_url) >= 1  # the pooled connection(s) of the store
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="recovery_ext._store.store"):
                write()
            assert any("retrying" in r.getMessage() for r in caplog.records)  # no pre-ping hid the dead connection
        assert store.pipelines.completed_items(own.pipeline_id, "a") == {f"k{i}": i for i in range(1, 6)}
        assert _terminate_other_backends(pg_url) >= 1
        with store.read_only() as conn:  # what ctx.read() opens: its start is retried too
            assert conn.scalar(select(func.count()).select_from(node_items)) == 5
    finally:
        store.close()


def test_a_connection_killed_between_the_also_writes_and_the_checkpoint_redoes_the_whole_transaction(pg_url):
    """The server ends the transaction's session after the ``also=`` writes, before the checkpoint statement
    (which runs on the same session's driver connection): nothing of the first attempt commits, the store
    retries the whole transaction, and the item and its write land exactly once."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        meta.create_all(store.engine)
        own = running_node(store)
        attempts: list[int] = []

        def write_then_lose_the_session(tx):
            attempts.append(len(attempts) + 1)
            tx.execute(insert(side_effects).values(item="k1"))
            if len(attempts) == 1:
                pid = tx.scalar(select(func.pg_backend_pid()))
                with psycopg.connect(
                    pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
                ) as other:
                    other.execute("SELECT pg_terminate_backend(%s)", (pid,))

        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", {"v": 1}, also=write_then_lose_the_session))
        assert attempts == [1, 2]
        assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k1": {"v": 1}}
        assert _side_effect_rows(store) == ["k1"]
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k2", 2, also=lambda tx: tx.execute(
            insert(side_effects).values(item="k2"))))
        assert _side_effect_rows(store) == ["k1", "k2"]  # the pool replaced the dead connection
    finally:
        store.close()


class _DropsAfterCommit:
    """A driver connection whose next statement commits, then loses its connection before the reply is read."""

    closed = False  # as a cursor: the store runs its statement on the connection's statement cursor, this

    def __init__(self, raw, admin_url: str) -> None:
        self._raw, self._admin_url = raw, admin_url

    def cursor(self, **_options):
        return self

    def execute(self, query, params=None, **kwargs):
        self._raw.execute(query, params, **kwargs)  # committed (autocommit)
        with psycopg.connect(self._admin_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (self._raw.info.backend_pid,))
        return self._raw.execute("SELECT 1")  # the dead connection fails like a lost reply


@pytest.mark.parametrize("batch", [False, True], ids=["per-item", "batch"])
def test_a_checkpoint_retried_after_its_commit_landed_returns_quietly(pg_url, caplog, monkeypatch, batch):
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = running_node(store)
        real, drops = store.pipelines.checkpoints.driver_autocommit, []

        @contextmanager
        def dropping_once():
            with real() as raw:
                if drops:
                    yield raw
                else:
                    drops.append(raw.info.backend_pid)
                    yield _DropsAfterCommit(raw, pg_url.replace("postgresql+psycopg://", "postgresql://"))

        monkeypatch.setattr(store.pipelines.checkpoints, "driver_autocommit", dropping_once)
        with caplog.at_level(logging.WARNING, logger="recovery_ext._store.store"):
            if batch:
                store.pipelines.checkpoint_items(
                    own, "a", [ItemCheckpoint("k1", 1), ItemCheckpoint("k2", 2)], stall_timeout=30
                )
            else:
                store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1), stall_timeout=30)
        assert len(drops) == 1 and any("retrying" in r.getMessage() for r in caplog.records)
        assert store.pipelines.completed_items(own.pipeline_id, "a") == ({"k1": 1, "k2": 2} if batch else {"k1": 1})
        with pytest.raises(IllegalTransition, match="already checkpointed"):  # a fresh call is no retry
            store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("k1", 9)])
    finally:
        store.close()


def test_a_batch_with_also_retried_after_its_commit_landed_runs_its_writes_once(store, monkeypatch):
    meta.create_all(store.engine)
    own = running_node(store)
    real, lost = store.pipelines.checkpoints.write, []

    @contextmanager
    def losing_the_first_commit_reply():
        with real() as conn:
            yield conn
        if not lost and _side_effect_rows(store):
            lost.append(1)  # committed; the caller sees the error a dropped connection gives
            raise StoreUnavailable("database unavailable: server closed the connection unexpectedly")

    monkeypatch.setattr(store.pipelines.checkpoints, "write", losing_the_first_commit_reply)
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("k1", 1, also=lambda tx: tx.execute(
        insert(side_effects).values(item="k1")))])
    assert lost == [1]
    assert _side_effect_rows(store) == ["k1"] and store.pipelines.completed_items(own.pipeline_id, "a") == {"k1": 1}


def test_a_kill_9_mid_batch_redoes_that_batch_only(pg_url):
    """A real process, kill -9ed while its batch is half done: the batch's writes never happened."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        meta.create_all(store.engine)
        own = running_node(store)
        worker = subprocess.Popen(
            [sys.executable, "-c", _BATCH_WORKER, pg_url, str(own.pipeline_id), str(own.epoch), own.owner],
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "support")])},
        )
        try:
            assert worker.stdout.readline().strip() == "mid-batch"  # batch 1 (k0-k3) flushed, k4, k5 buffered
            os.kill(worker.pid, signal.SIGKILL)
        finally:
            worker.wait(30)
        assert set(store.pipelines.completed_items(own.pipeline_id, "a")) == {"k0", "k1", "k2", "k3"}
        assert sorted(_side_effect_rows(store)) == ["k0", "k1", "k2", "k3"]
    finally:
        store.close()


_BATCH_WORKER = """
import sys, time
from sqlalchemy import insert
from test_checkpoints import side_effects
from recovery_ext._store.models import Ownership
from recovery_ext._store.pipelines import ItemCheckpoint
from recovery_ext._store.store import RecoveryStore

url, pid, epoch, owner = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = RecoveryStore(url)
own = Ownership(pid, epoch, owner)
note = lambda key: (lambda tx: tx.execute(insert(side_effects).values(item=key)))
store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint(f"k{i}", i, also=note(f"k{i}")) for i in range(4)])
def stall(tx):  # the last also= of batch 2: its other writes are done, its checkpoints not yet
    print("mid-batch", flush=True)
    time.sleep(600)
store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("k4", 4, also=note("k4")),
                                            ItemCheckpoint("k5", 5, also=note("k5")),
                                            ItemCheckpoint("k6", 6, also=stall)])
"""


def test_a_reclaim_between_the_also_writes_and_the_checkpoint_rolls_the_writes_back(pg_url):
    """PostgreSQL checks the fence last, in the checkpoint statement: the window that leaves open is
    a reclaim committed after the caller's writes and before that statement. Nothing of the old
    owner commits. (SQLite checks first and holds the database's write lock from there.)"""
    from helpers import expire

    store, other = RecoveryStore(pg_url), RecoveryStore(pg_url)
    try:
        store.migrate()
        meta.create_all(store.engine)
        own = running_node(store)
        reclaimed = []

        def write_then_get_reclaimed(tx):
            tx.execute(insert(side_effects).values(item="x"))
            expire(other, own.pipeline_id)
            reclaimed.extend(reclaim(other, PassPlan(limit=1, launching=True))[0])  # (reclaimed, given up)

        with pytest.raises(OwnershipLost):
            store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("x", 1, also=write_then_get_reclaimed)])
        assert len(reclaimed) == 1 and store.pipelines.get_pipeline(own.pipeline_id).epoch == own.epoch + 1
        assert _side_effect_rows(store) == [] and store.pipelines.completed_items(own.pipeline_id, "a") == {}
    finally:
        other.close()
        store.close()


def test_postgres_a_pipeline_deleted_under_a_checkpoint_takes_its_items_and_one_deleted_before_gets_none(pg_url):
    """PostgreSQL's items have no foreign key (migration 0025): the checkpoint's fence proves the pipeline row and
    holds it FOR KEY SHARE to the commit. A delete of the pipeline waits for that commit, then takes the new items
    with it (the trigger that keeps the foreign key's cascade), and a checkpoint after the delete writes nothing."""
    import threading
    import time

    from recovery_ext._errors import StoreError
    from recovery_ext._store.checkpoints import _batch_params
    from recovery_ext._store.migrations import load_query
    from recovery_ext._store.models import JsonText

    store = RecoveryStore(pg_url)
    store.migrate()
    try:
        held = running_node(store)
        with psycopg.connect(pg_url) as checkpoint, psycopg.connect(pg_url, autocommit=True) as watcher:
            written = checkpoint.execute(load_query("postgres", "checkpoint_new_items"), _batch_params(
                held, "a", [ItemCheckpoint("k1", JsonText("1")), ItemCheckpoint("k2", JsonText("2"))], None,
                store.dialect))
            assert written.fetchone()[0] == 2  # in the open transaction: the fence holds the pipeline row
            deleter = threading.Thread(target=_delete_pipeline, args=(pg_url, held.pipeline_id))
            deleter.start()
            deadline = time.monotonic() + 30
            while not watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                                      "query LIKE 'DELETE FROM rx_pipelines%%'").fetchone()[0]:
                assert time.monotonic() < deadline and deleter.is_alive(), "the delete did not wait for the fence"
                time.sleep(0.02)
            checkpoint.commit()
            deleter.join(30)
            assert not deleter.is_alive()
            assert watcher.execute("SELECT count(*) FROM rx_node_items WHERE pipeline_id = %s",
                                   (held.pipeline_id,)).fetchone()[0] == 0
            assert watcher.execute("SELECT count(*) FROM rx_deleted_pipelines").fetchone()[0] == 0  # nothing left

            gone = running_node(store)
            _delete_pipeline(pg_url, gone.pipeline_id)
            for write in (lambda: store.pipelines.checkpoint_item(gone, "a", ItemCheckpoint("k1", 1)),
                          lambda: store.pipelines.checkpoint_items(gone, "a", [ItemCheckpoint("k1", 1),
                                                                              ItemCheckpoint("k2", 2)])):
                with pytest.raises(StoreError):
                    write()
            assert watcher.execute("SELECT count(*) FROM rx_node_items").fetchone()[0] == 0
    finally:
        store.close()


def _delete_pipeline(url: str, pipeline_id: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM rx_pipelines WHERE id = %s", (pipeline_id,))


def test_postgres_a_batch_whose_results_pass_256_mb_in_all_checkpoints(pg_url):
    """One jsonb value holds at most 256 MB: the batch statements take their results as one json array and cast
    each on its own, so only one result is held to that limit (as before, when each was a text[] element)."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = running_node(store)
        text = "x" * (130 * 1024 * 1024)  # two of them: 260 MB of results in one statement
        store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("p1", {"text": text}), ItemCheckpoint("p2", [text])])
        with store.read() as conn:
            sizes = dict(conn.execute(select(node_items.c.item_key, func.length(
                func.cast(node_items.c.result, Text))).order_by(node_items.c.item_key)).all())
        assert sizes == {"p1": len(text) + len('{"text": ""}'), "p2": len(text) + len('[""]')}
    finally:
        store.close()
