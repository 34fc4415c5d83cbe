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
import time

from dagster import in_process_executor, job, op
from sqlalchemy import event

from bench.recovery_bench import drop_db, scratch_db
from recovery_ext.integration import RecoveryResource, execute_in_process, recoverable_op
from recovery_ext.integration.executor import with_recovery
from recovery_ext.integration.resources import shared_store

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


class Counter:
    """Transactions and statements on one engine (a COMMIT or an autocommit statement is a transaction)."""

    def __init__(self, engine) -> None:
        self.statements = self.transactions = 0
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, conn, cursor, statement, parameters, context, executemany) -> None:
        self.statements += 1
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            self.transactions += 1

    def _commit(self, conn) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.transactions += 1


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
        counter = Counter(store.engine)
        plain, recoverable, per_op = [], [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            assert plain_job.execute_in_process().success
            plain.append(time.perf_counter() - start)
            before = (counter.transactions, counter.statements)
            start = time.perf_counter()
            assert execute_in_process(recoverable_job, resources={"recovery": resource}).success
            recoverable.append(time.perf_counter() - start)
            per_op.append(((counter.transactions - before[0]) / args.ops, (counter.statements - before[1]) / args.ops))
        plain_median, recoverable_median = statistics.median(plain), statistics.median(recoverable)
        added = [(r - p) / args.ops * 1000 for r, p in zip(recoverable, plain)]
        transactions = statistics.median(t for t, _ in per_op)
        statements = statistics.median(s for _, s in per_op)
        print(f"overhead: {args.ops} chained ops, body {args.body_ms:.0f} ms, {args.runs} runs each, in-process, "
              "PostgreSQL")
        print(f"  plain job         {plain_median * 1000:8.1f} ms per run (median)")
        print(f"  recoverable job   {recoverable_median * 1000:8.1f} ms per run (median)")
        print(f"  ratio             {recoverable_median / plain_median:8.2f}x")
        print(f"  added per op      {statistics.median(added):8.1f} ms wall (median; goal <= 20 ms)")
        print(f"  database per op   {transactions:8.1f} transactions, {statements:.1f} statements "
              "(run start and end included, spread over the ops)")
    finally:
        shared_store(resource.url(), retry_budget=resource.store_retry_budget()).close()
        drop_db(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
