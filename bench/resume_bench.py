"""A resume run against a fresh run of only the remaining op (issue 11, item 1).

Side by side in one run, on both executors (multiprocess, in-process), for the nine-op chain of
``tests/support/replay_defs.py`` (``r1`` .. ``r9``, recoverable ops of two items each):

  (a) a fresh run of only ``r9`` (op selection; its input given in run config),
  (b) a resume run of the pipeline where ``r1`` .. ``r8`` are completed and ``r9`` is not:
      the finished nodes are replayed in the run worker (replay.py), ``r9`` runs,
  (c) the same resume through the previous path (every step to the executor; finished nodes
      skip themselves inside their own step), for reference.

Rounds alternate a, b, c so load drifts hit all three alike. Printed: median wall time of
``execute_job`` per case and the ratios b/a (goal <= 1.2) and c/a.

Run: .venv/bin/python -m bench.resume_bench [--rounds N] [--dagster-storage sqlite,postgres]
(PostgreSQL at 127.0.0.1:5432 for the application tables; Dagster's own storage is SQLite in a
scratch DAGSTER_HOME and/or a scratch PostgreSQL database: every replayed step writes its events there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import DagsterInstance, build_reconstructable_job, execute_job
from sqlalchemy import update

from bench.recovery_bench import drop_db, scratch_db
from recovery_ext._dagster.executor import RecoveringExecutor
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import PassPlan, Scope
from recovery_ext._store.schema import nodes, pipelines
from recovery_ext._store.store import RecoveryStore

TESTS = Path(__file__).resolve().parent.parent / "tests" / "support"
sys.path.insert(0, str(TESTS))


def recon(name: str):
    return build_reconstructable_job("replay_defs", "bound", reconstructable_args=(name,),
                                     reconstructor_working_directory=str(TESTS))


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run_ok(job, instance, **kwargs) -> None:
    with execute_job(job, instance=instance, **kwargs) as result:
        if not result.success:
            raise SystemExit(f"bench run {result.run_id} failed")


def last_left(store: RecoveryStore, pipeline_id: int, last: str) -> dict:
    """The pipeline as a crash before ``last`` started leaves it, reclaimed: the tags of its resume run."""
    from helpers import expire

    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == last)
                     .values(status="pending", completed_at=None, output=None))
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id).values(status="running", completed_at=None))
    expire(store, pipeline_id)
    (reclaimed,) = store.recovery.recovery_pass(PassPlan(limit=1, launching=True), Scope()).reclaimed
    return {TAG_PIPELINE: str(pipeline_id), TAG_RESUME_NUMBER: str(reclaimed.resume_number)}


def bench_executor(job_name: str, store: RecoveryStore, instance, rounds: int) -> dict[str, float]:
    import replay_defs

    job = recon(job_name)
    last = replay_defs.CHAIN[-1]
    upstream = {"chain": replay_defs.CHAIN[:-1], "items": ["r8-0", "r8-1"]}
    only_last = {"ops": {last: {"inputs": {"upstream": {"value": upstream}}}}}
    replay_events = RecoveringExecutor._events
    previous_path = lambda self, scope, ctx, plan: self.inner.execute(ctx, plan)  # noqa: E731
    run_ok(job, instance)  # warm-up, and the pipeline whose last node every resume below redoes
    pipeline_id = max(p.id for p in store.reports.list_pipelines())
    times: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    for _ in range(rounds):
        times["a"].append(timed(lambda: run_ok(job, instance, op_selection=[last], run_config=only_last)))
        for case, events in (("b", replay_events), ("c", previous_path)):
            tags = last_left(store, pipeline_id, last)
            RecoveringExecutor._events = events
            try:
                times[case].append(timed(lambda tags=tags: run_ok(job, instance, tags=tags)))
            finally:
                RecoveringExecutor._events = replay_events
            assert store.pipelines.get_pipeline(pipeline_id).status == "completed"
    return {case: statistics.median(values) for case, values in times.items()}


@contextmanager
def dagster_instance(storage: str) -> Iterator[DagsterInstance]:
    """A scratch Dagster instance: SQLite storage in a temporary home, or a scratch PostgreSQL database."""
    with tempfile.TemporaryDirectory() as home:
        if storage == "sqlite":
            with DagsterInstance.local_temp(home) as instance:
                yield instance
            return
        url = scratch_db()
        try:
            driver_url = url.replace("postgresql://", "postgresql+psycopg2://", 1)
            Path(home, "dagster.yaml").write_text(
                f"telemetry:\n  enabled: false\nstorage:\n  postgres:\n    postgres_url: {driver_url}\n")
            with DagsterInstance.from_config(home) as instance:
                yield instance
        finally:
            drop_db(url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dagster-storage", default="sqlite,postgres",
                        help="Dagster's own storage, comma-separated: sqlite (a scratch home), postgres")
    args = parser.parse_args()
    url = scratch_db()
    os.environ["RECOVERY_DATABASE_URL"] = url
    store = RecoveryStore(url)
    store.migrate()
    print(f"resume bench: 9-op chain, 2 items per op, {args.rounds} rounds, medians of execute_job wall time")
    try:
        for storage in args.dagster_storage.split(","):
            with dagster_instance(storage) as instance:
                for label, job_name in (("multiprocess", "chain9_mp"), ("in-process", "chain9_inproc")):
                    m = bench_executor(job_name, store, instance, args.rounds)
                    print(f"{storage:>8} {label:>12}: (a) fresh run of r9 only {m['a']:.2f} s | (b) resume, 8 of 9 "
                          f"done {m['b']:.2f} s | b/a = {m['b'] / m['a']:.2f}x (goal <= 1.2x) | (c) previous path "
                          f"{m['c']:.2f} s, c/a = {m['c'] / m['a']:.2f}x", flush=True)
    finally:
        store.close()
        drop_db(url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
