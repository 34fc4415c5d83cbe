"""Batched item checkpoints beside a bare multi-row INSERT of the same rows, on the same PostgreSQL.

Each round times, one after the other (so load changes hit every side alike), in an order that starts one
side later each round (so none always runs first), for 100 and for 1,000 items per transaction:

- ``ctx.items(keys, batch=N)``: what an op body runs; a :class:`NodeContext` completes each item
  and flushes every N into one fenced checkpoint transaction (the op's Dagster context is not
  involved: this loop never touches it);
- ``store.pipelines.checkpoint_items``: the store call under it, given ready :class:`ItemCheckpoint` values;
- a bare INSERT of the same rows (the same keys, statuses, JSON results, owner and epoch) into a
  copy of ``rx_node_items`` with the same columns and primary key, one autocommit statement per N rows,
  prepared: once as ``INSERT ... SELECT FROM unnest`` of bound arrays and once as psycopg's
  ``executemany`` (pipelined, one round trip per N rows). No fence, no ON CONFLICT, no refusal of
  completed items, no stall push: only the rows. ``rx_node_items`` has no foreign key on PostgreSQL
  (migration 0025: the fence holds the pipeline row); ``bare unnest, FK`` is the same INSERT into a copy
  that has the foreign key it had before, checked once per row.

Printed: the median rate of each (items/s), the batched rates as a share of the fastest bare INSERT, and the
range of that share over the rounds (each round's rate against the same round's fastest bare INSERT). Goal:
batched >= 90% of it.

Run: .venv/bin/python -m bench.batch_bench [--items 20000] [--rounds 5]
(PostgreSQL at 127.0.0.1:5432, RECOVERY_TEST_PG; a scratch database is created and dropped.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg.types.json import Jsonb

from dagster import DagsterInstance, build_op_context

from bench.recovery_bench import drop_db, scratch_db
from recovery_ext._dagster.context import NodeContext
from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._store.models import ItemCheckpoint, Ownership
from recovery_ext._store.store import RecoveryStore

BATCHES = (100, 1000)
BARE_UNNEST = """
INSERT INTO {table} (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
SELECT %(pipeline)s, %(node)s, u.item_key, u.status, u.result::jsonb, %(owner)s, %(epoch)s, now()
FROM unnest(%(keys)b::text[], %(statuses)b::text[], %(results)b::text[]) AS u(item_key, status, result)
"""
BARE_ROW = ("INSERT INTO {table} (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, now())")


def running_node(store: RecoveryStore, tag: str) -> Ownership:
    own = store.pipelines.create_pipeline("bench", ["items"], owner=tag)
    store.pipelines.start_node(own, "items")
    return own


def result_of(i: int) -> dict:
    return {"i": i, "label": f"item {i}"}


def through_ctx_items(store: RecoveryStore, own: Ownership, count: int, batch: int) -> float:
    # an op's context as a test builds it: ctx.items reports its progress on the run, as in a real op
    ctx = NodeContext(build_op_context(instance=DagsterInstance.ephemeral()), store, own, "items",
                      HeartbeatSettings(), None, None)
    start = time.perf_counter()
    for i, item in enumerate(ctx.items([f"item-{i}" for i in range(count)], batch=batch)):
        item.complete(result_of(i))
    return time.perf_counter() - start


def through_store(store: RecoveryStore, own: Ownership, count: int, batch: int) -> float:
    start = time.perf_counter()
    for first in range(0, count, batch):
        store.pipelines.checkpoint_items(own, "items", [ItemCheckpoint(f"item-{i}", result_of(i))
                                              for i in range(first, min(count, first + batch))])
    return time.perf_counter() - start


def bare_unnest(conn: psycopg.Connection, table: str, own: Ownership, count: int, batch: int) -> float:
    query = BARE_UNNEST.format(table=table)
    start = time.perf_counter()
    for first in range(0, count, batch):
        span = range(first, min(count, first + batch))
        conn.execute(query, {"pipeline": own.pipeline_id, "node": "items", "owner": own.owner, "epoch": own.epoch,
                             "keys": [f"item-{i}" for i in span], "statuses": ["completed"] * len(span),
                             "results": [json.dumps(result_of(i), separators=(",", ":")) for i in span]},
                     prepare=True)
    return time.perf_counter() - start


def bare_executemany(conn: psycopg.Connection, table: str, own: Ownership, count: int, batch: int) -> float:
    query = BARE_ROW.format(table=table)
    start = time.perf_counter()
    with conn.cursor() as cursor:
        for first in range(0, count, batch):
            cursor.executemany(query, [(own.pipeline_id, "items", f"item-{i}", "completed", Jsonb(result_of(i)),
                                        own.owner, own.epoch) for i in range(first, min(count, first + batch))])
    return time.perf_counter() - start


def make_bare_tables(conn: psycopg.Connection) -> None:
    """The bare INSERTs' tables, made anew (a second load level of dbos_bench makes them again): a copy of
    ``rx_node_items`` as it is, and one with the foreign key it had before migration 0025."""
    conn.execute("DROP TABLE IF EXISTS rx_bench_bare, rx_bench_bare_fk")
    conn.execute("CREATE TABLE rx_bench_bare (LIKE rx_node_items INCLUDING ALL)")
    conn.execute("CREATE TABLE rx_bench_bare_fk (LIKE rx_node_items INCLUDING ALL)")
    conn.execute("ALTER TABLE rx_bench_bare_fk ADD FOREIGN KEY (pipeline_id) REFERENCES rx_pipelines (id) "
                 "ON DELETE CASCADE")


SIDES = ("ctx.items", "checkpoint_items", "bare unnest", "bare executemany", "bare unnest, FK")


def one_round(store: RecoveryStore, conn: psycopg.Connection, count: int, batch: int, tag: str,
              shift: int = 0) -> dict[str, float]:
    """Each side writes ``count`` fresh rows; returns items per second by side. The sides run in turn starting
    ``shift`` sides later (each round one later), so no side always runs first, after the other batch size's last
    side (an autovacuum of ``rx_node_items`` or a server checkpoint then hits every side alike)."""
    runs: dict[str, Callable[[Ownership], float]] = {
        "ctx.items": lambda own: through_ctx_items(store, own, count, batch),
        "checkpoint_items": lambda own: through_store(store, own, count, batch),
        "bare unnest": lambda own: bare_unnest(conn, "rx_bench_bare", own, count, batch),
        "bare executemany": lambda own: bare_executemany(conn, "rx_bench_bare", own, count, batch),
        "bare unnest, FK": lambda own: bare_unnest(conn, "rx_bench_bare_fk", own, count, batch),
    }
    rates = {}
    order = list(runs)
    for side in order[shift % len(order):] + order[:shift % len(order)]:
        run = runs[side]
        own = running_node(store, f"{tag}-{side}")
        rates[side] = count / run(own)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20000, help="items per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    url = scratch_db()
    store = RecoveryStore(url)
    try:
        store.migrate()
        with psycopg.connect(url, autocommit=True) as conn:
            make_bare_tables(conn)
            for batch in BATCHES:
                one_round(store, conn, batch * 2, batch, f"warm-up-{batch}")  # prepares every statement
            samples = {batch: {side: [] for side in SIDES} for batch in BATCHES}
            for round_no in range(args.rounds):
                for batch in BATCHES:
                    for side, rate in one_round(store, conn, args.items, batch, f"r{round_no}-{batch}",
                                                    shift=round_no).items():
                        samples[batch][side].append(rate)
        print(f"batched checkpoints vs a bare multi-row INSERT of the same rows, same PostgreSQL, "
              f"{args.items} items per side per round, median of {args.rounds} interleaved rounds")
        for batch in BATCHES:
            median = {side: statistics.median(values) for side, values in samples[batch].items()}
            bare = max(rate for side, rate in median.items() if side.startswith("bare"))
            print(f"  {batch} items per transaction")
            rounds = samples[batch]
            for side in SIDES:
                per_round = [rate / max(rounds[other][i] for other in SIDES if other.startswith("bare"))
                             for i, rate in enumerate(rounds[side])]
                share = (f"{median[side] / bare:6.0%} of the fastest bare INSERT "
                         f"(rounds: {min(per_round):.0%}-{max(per_round):.0%})" if not side.startswith("bare") else "")
                print(f"    {side:<20} {median[side]:9.0f} /s   {share}")
        print("  goal: batched >= 90% of the fastest bare INSERT", flush=True)
    finally:
        store.close()
        drop_db(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
