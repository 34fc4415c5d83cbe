"""Where a per-item checkpoint's time goes on PostgreSQL, against one bare durable commit.

Eleven ways of committing one item, each its own autocommit transaction, run in turn in chunks of 50 so
they see the same load (each round starting one way later, so none always runs first), on a scratch database:

- ``ctx.items``: an op body's loop, ``for item in ctx.items(keys): item.complete(result)`` (one loop over
  every key of the run, 50 items taken from it in each turn);
- ``store``: ``store.pipelines.checkpoint_item`` (what ``ctx.items()`` calls for each item);
- ``stall push``: the same with a stall timeout of 600 s (``checkpoint_new_item_stall.sql``, the one-item
  statement with the stall deadline's CTE, what a node with ``stall_timeout`` set writes per item; its stall
  deadline moves in the same statement only when less than the timeout is left, ``pipelines.stall_push``: here
  once, and then once a minute if a run takes longer);
- ``stall due``: the same with a stall timeout of a millisecond, so that every item moves the deadline (a new
  version of the node's row and of its index entries each time), for measurement only;
- ``with a call``: the same keeping one provider call (its ledger row written in the same statement: what an
  item that asked an LLM writes);
- ``kept``: the store's statement through ``driver_autocommit`` (the database's kept connection, see
  ``KeptConnection``) on its statement cursor, without the store's own code around it;
- ``checkout``: the statement on a connection checked out of the store's pool for each item, switched to
  autocommit and back (what ``driver_autocommit`` did before it kept a connection), for measurement only;
- ``statement``: the statement the store sends for it (``checkpoint_new_item.sql``: the fence and the
  INSERT), bound and run on a plain psycopg connection, prepared, on one cursor made once (as are the
  three rows below);
- ``no lock``: that statement without the fence's ``FOR KEY SHARE``, for measurement only: it checks the
  epoch but holds nothing, so a reclaim could commit between its check and its commit;
- ``plain``: an INSERT of the same row into ``rx_node_items``, without the fence;
- ``bare``: an INSERT of one key into a one-column table: one durable commit and nothing else.

It prints each one's rate, its share of the bare commit's rate and the client's CPU per item, so the gap
between two rows says what one layer costs: the table's own row (plain), the epoch check (no lock), the
fence's lock (statement), a pool checkout per item (checkout), the kept connection's hand-over (kept), the
library's own code (store), the op's loop (ctx.items); what a node's settings and calls add to the store's
statement (stall push, with a call), and what moving the stall deadline on every item would (stall due).
Nothing is asserted: the figures go in the closing notes.

    .venv/bin/python -m bench.checkpoint_floor [--rounds 40] [--chunk 50]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import psycopg

from dagster import DagsterInstance, build_op_context

from bench.batch_bench import running_node
from bench.recovery_bench import scratch_store
from recovery_ext._dagster.context import NodeContext
from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._store.hot_path import statement_cursor
from recovery_ext._store.migrations import load_query
from recovery_ext._store.models import ItemCheckpoint, ProviderCall
from recovery_ext._store.store import RecoveryStore

PLAIN = ("INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch) "
         "VALUES (%s, 'items', %s, 'completed', %s::jsonb, %s, %s)")
RESULT = '{"i":1}'


def ways(store: RecoveryStore, conn: psycopg.Connection, items: int) -> dict[str, Callable[[str], object]]:
    own = running_node(store, "floor")
    # the op's context as a test builds it (its progress goes to the run's tags, as in a real op); one loop over
    # every key the run will take, so its one start statement is not paid again per chunk
    ctx = NodeContext(build_op_context(instance=DagsterInstance.ephemeral()), store, running_node(store, "loop"),
                      "items", HeartbeatSettings(), None, None)
    loop = ctx.items([f"loop-{i}" for i in range(items)])
    # the plain connection's rows run on one cursor made once, the fastest way psycopg sends a statement (its
    # conn.execute makes a cursor per call: about 15 us more client CPU each)
    cursor = conn.cursor()
    statement = load_query(store.dialect.migrations_folder, "checkpoint_new_item")
    unlocked = statement.replace("FOR KEY SHARE", "")
    assert unlocked != statement, "checkpoint_new_item.sql no longer locks FOR KEY SHARE: update this bench"

    def through_ctx_items(_key: str) -> object:
        next(loop).complete({"i": 1})
        return None

    def through_store(key: str) -> object:
        store.pipelines.checkpoint_item(own, "items", ItemCheckpoint(key, {"i": 1}))
        return None

    def pushing_the_stall_deadline(key: str) -> object:
        store.pipelines.checkpoint_item(own, "items", ItemCheckpoint(key, {"i": 1}), stall_timeout=600)
        return None

    due = running_node(store, "due")  # its own node: a 600 s push elsewhere would leave it far from due

    def pushing_every_time(key: str) -> object:
        store.pipelines.checkpoint_item(due, "items", ItemCheckpoint(key, {"i": 1}), stall_timeout=0.001)
        return None

    def keeping_a_call(key: str) -> object:
        call = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=12, tokens_out=3,
                            latency_seconds=0.5, cost=0.0001)
        store.pipelines.checkpoint_item(own, "items", ItemCheckpoint(key, {"i": 1}, calls=(call,)), stall_timeout=600)
        return None

    def params(key: str) -> dict[str, object]:
        return {"pipeline": own.pipeline_id, "epoch": own.epoch, "owner": own.owner, "node": "items", "key": key,
                "status": "completed", "result": RESULT}

    def kept(key: str) -> object:
        with store._db.driver_autocommit() as raw:
            return statement_cursor(raw).execute(statement, params(key), prepare=True)

    def checked_out(key: str) -> object:
        pooled = store._db.engine.raw_connection()
        try:
            raw = pooled.driver_connection
            raw.autocommit = True
            try:
                return raw.execute(statement, params(key), prepare=True)
            finally:
                raw.autocommit = False
        finally:
            pooled.close()

    return {
        "ctx.items": through_ctx_items,
        "store": through_store,
        "stall push": pushing_the_stall_deadline,
        "stall due": pushing_every_time,
        "with a call": keeping_a_call,
        "kept": kept,
        "checkout": checked_out,
        "statement": lambda key: cursor.execute(statement, params(key), prepare=True),
        "no lock": lambda key: cursor.execute(unlocked, params(key), prepare=True),
        "plain": lambda key: cursor.execute(PLAIN, (own.pipeline_id, key, RESULT, own.owner, own.epoch), prepare=True),
        "bare": lambda key: cursor.execute("INSERT INTO rx_bench_one_commit VALUES (%s)", (key,), prepare=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds of every way in turn (default 40)")
    parser.add_argument("--chunk", type=int, default=50, help="items per way per round (default 50)")
    args = parser.parse_args()
    with scratch_store() as (url, store), psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE rx_bench_one_commit (item_key text PRIMARY KEY)")
        each = ways(store, conn, 20 + args.rounds * args.chunk)
        wall = dict.fromkeys(each, 0.0)
        cpu = dict.fromkeys(each, 0.0)
        for name, work in each.items():  # warm: prepared statements, pooled connection
            for i in range(20):
                work(f"warm-{name}-{i}")
        names = list(each)
        for round_no in range(args.rounds):
            # each round starts one way later, so no way always runs first (after the previous round's last)
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                work = each[name]
                started, used = time.perf_counter(), time.process_time()
                for i in range(args.chunk):
                    work(f"{name}-{round_no}-{i}")
                wall[name] += time.perf_counter() - started
                cpu[name] += time.process_time() - used
    count = args.rounds * args.chunk
    print(f"one item per autocommit transaction, {args.rounds} rounds of {args.chunk} in turn, PostgreSQL")
    for name in each:
        print(f"  {name:<10} {count / wall[name]:7.0f} /s   {wall['bare'] / wall[name]:4.2f}x the bare commit   "
              f"client CPU {1e6 * cpu[name] / count:4.0f} us/item")

if __name__ == "__main__":
    main()
