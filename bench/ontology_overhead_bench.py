"""Cost when nothing fails on the real ontology job (issue 11 item 6): recoverable ops vs plain ops, same bodies.

The shipped ontology job (``pipelines/ontology.py``: 9 recoverable ops, per-table items whose
ontology rows commit with their checkpoints) against a job of plain Dagster ops running the very
same bodies through a context without recovery: no pipeline row, no node rows, no checkpoints,
no fencing, no heartbeats, no provider guard; its ``ctx.transaction()`` is a plain transaction
and its ``item.complete(also=...)`` runs only the ``also`` writes. Both write the same ontology
rows into the same PostgreSQL database, read the same sample shop, in-process, alternating, in
one run of this script.

The LLM answers through a local OpenAI-compatible server (``demo_llm``) after ``--llm-ms`` of
latency (default 50 ms, far less than a real model takes, so the overhead is not hidden);
``--llm-ms 0`` uses the offline heuristic enricher (no HTTP at all: the worst case).

Run: .venv/bin/python -m bench.ontology_overhead_bench [--runs 15] [--llm-ms 50] [--load idle|loaded]
Goal: recoverable job wall <= 1.05x the plain job's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster import GraphDefinition, In, OpDefinition, in_process_executor, op

from bench.overhead_bench import wire_counts
from bench.recovery_bench import drop_db, scratch_db
from recovery_pipelines.demo_llm import serve
from recovery_ext._store.models import FencedTransaction
from recovery_ext import RecoveryResource, execute_in_process
from recovery_ext._dagster.resources import shared_store
from recovery_pipelines.llm import LLMResource
from recovery_pipelines.ontology import SourceDatabase, make_ontology_job, ontology_graph
from recovery_pipelines.ontology_schema import MIGRATIONS
from recovery_pipelines.sample_data import create_sample_database


class PlainLLM(LLMResource):
    """The same enricher without recovery-ext's provider guard (breaker, outage pauses)."""

    def enricher(self, node: Any = None):
        return super().enricher(None)


class PlainItem:
    def __init__(self, ctx: PlainContext, key: str) -> None:
        self.ctx, self.key = ctx, key

    def complete(self, result: Any = None, *, also=None) -> None:
        if also is not None:
            with self.ctx.transaction() as tx:
                also(tx)
        self.ctx.results[self.key] = result

    degrade = complete


class PlainContext:
    """What the ontology bodies use of ``NodeContext``, with no recovery behind it."""

    def __init__(self, context, store) -> None:
        self.context, self._store = context, store
        self.metadata: dict[str, Any] = {}
        self.results: dict[str, Any] = {}

    log = property(lambda self: self.context.log)
    op_config = property(lambda self: self.context.op_config)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[FencedTransaction]:
        with self._store.write() as conn:  # a plain transaction: no fence
            tx = FencedTransaction(self._store, conn, None)
            try:
                yield tx
            finally:
                tx.close()

    @contextlib.contextmanager
    def read(self):
        with self._store.read() as conn:
            yield conn

    def items(self, keys):
        for key in dict.fromkeys(str(k) for k in keys):
            yield PlainItem(self, key)

    def completed_items(self) -> dict[str, Any]:
        return dict(self.results)

    def node_statuses(self) -> dict[str, str]:
        return {}


def plain_op(recoverable: OpDefinition) -> OpDefinition:
    body = recoverable.compute_fn.decorated_fn.__rx_body__
    names = list(recoverable.ins)

    def compute(context, **inputs):
        ctx = PlainContext(context, context.resources.recovery.get_store())
        output = body(ctx, **inputs)
        context.add_output_metadata(ctx.metadata)
        return output

    return op(name=recoverable.name, ins={n: In() for n in names}, config_schema=recoverable.config_schema,
              required_resource_keys=set(recoverable.required_resource_keys))(compute)


def plain_ontology_job():
    graph = GraphDefinition(name="plain_ontology", node_defs=[plain_op(n.definition) for n in ontology_graph.nodes],
                            dependencies=ontology_graph.dependencies)
    return graph.to_job(name="plain_ontology_job", executor_def=in_process_executor,
                        config={"ops": {"discover_schema": {"config": {"source_name": "sample"}}}})


@contextlib.contextmanager
def cpu_load(load: str) -> Iterator[None]:
    if load == "idle":
        yield
        return
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
    from hog import cpu_hog

    with cpu_hog():
        yield


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--llm-ms", type=float, default=50.0)
    parser.add_argument("--load", choices=("idle", "loaded"), default="idle")
    args = parser.parse_args()
    url = scratch_db()
    server = None
    try:
        with tempfile.TemporaryDirectory() as folder:
            shop = f"sqlite:///{Path(folder) / 'shop.sqlite3'}"
            create_sample_database(shop)
            if args.llm_ms > 0:
                server, base_url = serve(latency=args.llm_ms / 1000)
                llm_kwargs = {"base_url": base_url, "initial_delay": 0.1, "max_delay": 1.0}
            else:
                llm_kwargs = {}
            recovery = RecoveryResource(database_url=url, migration_packages=[MIGRATIONS])
            store = shared_store(recovery.url(), retry_budget=recovery.store_retry_budget())
            store.migrate(MIGRATIONS)
            recoverable_job = make_ontology_job(executor_def=in_process_executor)
            plain_job = plain_ontology_job()
            rec_resources = {"recovery": recovery, "llm": LLMResource(**llm_kwargs), "source": SourceDatabase(url=shop)}
            plain_resources = {**rec_resources, "llm": PlainLLM(**llm_kwargs)}
            # warm-up: connections, caches, the first ontology rows
            assert execute_in_process(recoverable_job, resources=rec_resources).success
            assert plain_job.execute_in_process(resources=plain_resources).success
            plain, recoverable = [], []
            ops = len(ontology_graph.nodes)

            def run_plain() -> None:
                start = time.perf_counter()
                assert plain_job.execute_in_process(resources=plain_resources).success
                plain.append(time.perf_counter() - start)

            def run_recoverable() -> None:
                start = time.perf_counter()
                assert execute_in_process(recoverable_job, resources=rec_resources).success
                recoverable.append(time.perf_counter() - start)

            with cpu_load(args.load):
                for round_no in range(args.runs):  # the order alternates, so drifts hit both alike
                    for run in ((run_plain, run_recoverable) if round_no % 2 == 0 else (run_recoverable, run_plain)):
                        run()
            plain_median, recoverable_median = statistics.median(plain), statistics.median(recoverable)
            added = [(r - p) / ops * 1000 for r, p in zip(recoverable, plain, strict=False)]
            spread = (f"{min(plain) * 1000:.0f}-{max(plain) * 1000:.0f} / "
                      f"{min(recoverable) * 1000:.0f}-{max(recoverable) * 1000:.0f}")
            llm = f"LLM stand-in {args.llm_ms:.0f} ms" if args.llm_ms > 0 else "heuristic enricher (no LLM latency)"
            print(f"ontology job: {ops} ops, {llm}, {args.runs} runs each, in-process, PostgreSQL, {args.load}")
            print(f"  plain ops, same bodies   {plain_median * 1000:8.1f} ms per run (median)")
            print(f"  recoverable ops          {recoverable_median * 1000:8.1f} ms per run (median)")
            print(f"  ratio                    {recoverable_median / plain_median:8.3f}x   (goal <= 1.05x)")
            print(f"  added per op             {statistics.median(added):8.1f} ms wall (median of the pairs)")
            print(f"  run-to-run range         {spread} ms (plain / recoverable)")
            wire = {}
            for name, job_def, resources in (("plain", plain_job, plain_resources),
                                             ("recoverable", recoverable_job, rec_resources)):
                with wire_counts(store) as wire[name]:  # one more run each, untimed: tracing costs time
                    run = execute_in_process if name == "recoverable" else type(job_def).execute_in_process
                    assert run(job_def, resources=resources).success
            print(
                "  database per op          "
                + ", ".join(
                    f"{name} {counts['round_trips'] / ops:.1f} round trips / "
                    f"{counts['transactions'] / ops:.1f} transactions"
                    for name, counts in wire.items()
                )
                + " (ontology rows included; libpq trace of one more run each)"
            )
            store.close()
    finally:
        if server is not None:
            server.shutdown()
        drop_db(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
