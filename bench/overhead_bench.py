"""Cost when nothing fails (issue 11 item 6): a recoverable op vs a plain op with the same body.

Two jobs of OPS chained ops with the same body (a fixed sleep standing in for real work), run
in-process on PostgreSQL, alternating, in one run of this script. Reported: wall per run of
each, the added wall per op (median), the ratio, and what each recoverable op costs the
database (transactions and statements per op, counted with SQLAlchemy event hooks on the
store's engine; autocommit statements count as one transaction each).

Run: .venv/bin/python -m bench.overhead_bench [--ops 8] [--runs 15] [--body-ms 20]
Goal: <= 20 ms wall per recoverable op excluding its body.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import in_process_executor, job, op

from bench.recovery_bench import drop_db, scratch_db
from recovery_ext import RecoveryResource, execute_in_process, recoverable_op
from recovery_ext._dagster.executor import with_recovery
from recovery_ext._dagster.resources import shared_store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from helpers import round_trips, sent_round_trips  # noqa: E402 - the tests' libpq trace

BODY_SECONDS = [0.02]


def body() -> int:
    time.sleep(BODY_SECONDS[0])
    return 1


def build_jobs(count: int):
    """``count`` chained ops of each kind: each but the first takes the previous one's output."""
    plain_ops, recoverable_ops = [], []
    for i in range(count):
        if i == 0:
            @op(name="plain_0")
            def plain(context) -> int:
                return body()

            @recoverable_op(name="recoverable_0", ins={})
            def recoverable(ctx) -> int:
                return body()
        else:
            @op(name=f"plain_{i}")
            def plain(context, upstream: int) -> int:
                return upstream + body()

            @recoverable_op(name=f"recoverable_{i}")
            def recoverable(ctx, upstream) -> int:
                return upstream + body()

        plain_ops.append(plain)
        recoverable_ops.append(recoverable)

    def chain(ops):
        def graph():
            previous = ops[0]()
            for node in ops[1:]:
                previous = node(previous)
        return graph

    plain_job = job(name="plain_job", executor_def=in_process_executor)(chain(plain_ops))
    recoverable_job = job(name="recoverable_job", executor_def=with_recovery(in_process_executor))(
        chain(recoverable_ops))
    return plain_job, recoverable_job


@contextmanager
def wire_counts(store) -> Iterator[dict[str, int]]:
    """Round trips and transactions on the wire while the block runs, from the libpq trace of every connection
    the store's pool hands out (``tests/helpers.round_trips``): SQLAlchemy's statements and the store's prepared
    driver statements alike. A round trip is a Sync or a simple Query; a transaction ended is a ReadyForQuery
    back to idle (an autocommit statement, or a COMMIT/ROLLBACK). Tracing costs time: count on a run that is
    not timed. The counts are filled in when the block exits."""
    counts: dict[str, int] = {}
    with round_trips(store) as messages:
        yield counts
    counts["round_trips"] = len(sent_round_trips(messages))
    counts["transactions"] = messages.count("B ReadyForQuery I")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=8)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--body-ms", type=float, default=20.0)
    args = parser.parse_args()
    BODY_SECONDS[0] = args.body_ms / 1000
    plain_job, recoverable_job = build_jobs(args.ops)
    url = scratch_db()
    try:
        resource = RecoveryResource(database_url=url)
        store = shared_store(resource.url(), retry_budget=resource.store_retry_budget())
        store.migrate()
        execute_in_process(recoverable_job, resources={"recovery": resource})  # warm-up: connections, caches
        plain_job.execute_in_process()
        plain, recoverable = [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            assert plain_job.execute_in_process().success
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert execute_in_process(recoverable_job, resources={"recovery": resource}).success
            recoverable.append(time.perf_counter() - start)
        with wire_counts(store) as wire:  # one more run, untimed: tracing costs time
            assert execute_in_process(recoverable_job, resources={"recovery": resource}).success
        plain_median, recoverable_median = statistics.median(plain), statistics.median(recoverable)
        added = [(r - p) / args.ops * 1000 for r, p in zip(recoverable, plain, strict=False)]
        print(f"overhead: {args.ops} chained ops, body {args.body_ms:.0f} ms, {args.runs} runs each, in-process, "
              "PostgreSQL")
        print(f"  plain job         {plain_median * 1000:8.1f} ms per run (median)")
        print(f"  recoverable job   {recoverable_median * 1000:8.1f} ms per run (median)")
        print(f"  ratio             {recoverable_median / plain_median:8.2f}x")
        print(f"  added per op      {statistics.median(added):8.1f} ms wall (median; goal <= 20 ms)")
        print(f"  database per op   {wire['round_trips'] / args.ops:8.1f} round trips, "
              f"{wire['transactions'] / args.ops:.1f} transactions (run start and end included, spread over the ops; "
              "libpq trace of one more run)")
    finally:
        shared_store(resource.url(), retry_budget=resource.store_retry_budget()).close()
        drop_db(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
