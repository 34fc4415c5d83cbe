"""Which library files one crash crosses: the orphan sensor's tick that recovers it, and the resume run.

A run worker executes a two-op job in a child process and is ``kill -9``ed in the second op's third item. Its
pipeline's heartbeat deadline is then moved into the past on the database clock (what waiting out the timeout
does), and this process traces, with :func:`sys.setprofile` on every thread, (1) the tick of the orphan sensor
that recovers it and (2) the resume run it requests, executed in process. A code server evaluates every tick in
one long-lived process, so an earlier tick (before the deadline passes: it finds nothing) has built the store
already; that first tick is traced and shown apart. It prints, for each, the number of ``recovery_ext``
files whose code ran and their names. The store is the embedded default (SQLite); ``--postgres`` runs the same
crash on a scratch PostgreSQL database (production's path: the server's hot-path functions instead of the portable
Python), dropped afterwards. Nothing is asserted: the figures go in the closing notes.

    .venv/bin/python -m bench.files_crossed [--list] [--functions] [--postgres]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, build_sensor_context, job

import recovery_ext
import recovery_ext.store
import recovery_ext.testing
from bench.recovery_bench import scratch_store
from recovery_ext import NodeContext, RecoveryResource, make_orphan_sensor, recoverable_op

LIBRARY = Path(recovery_ext.__file__).resolve().parent
ITEMS = 5
KILL_AT = 2


@recoverable_op
def first(ctx: NodeContext) -> int:
    for item in ctx.items(str(i) for i in range(ITEMS)):
        item.complete(int(item.key))
    return ITEMS


@recoverable_op
def second(ctx: NodeContext, total: int) -> int:
    for index, item in enumerate(ctx.items(str(i) for i in range(ITEMS))):
        if index == KILL_AT and os.environ.get("FILES_CROSSED_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        item.complete(int(item.key))
    return total


@job
def crash_job() -> None:
    second(first())


def resources(url: str) -> dict[str, Any]:
    return {"recovery": RecoveryResource(database_url=url, deployment="files-crossed")}


@contextmanager
def traced(files: dict[str, set[str]]) -> Iterator[None]:
    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(str(LIBRARY)):
                files.setdefault(str(Path(path).relative_to(LIBRARY)), set()).add(frame.f_code.co_qualname)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def crash(url: str) -> None:
    """The child: run the job until it kills itself."""
    instance = DagsterInstance.get()
    recovery_ext.testing.execute_in_process(crash_job, instance=instance, resources=resources(url))


def measure(url: str, show: Callable[[str, dict[str, set[str]]], None]) -> None:
    child = subprocess.run([sys.executable, "-m", "bench.files_crossed", "--crash", url],
                           env={**os.environ, "FILES_CROSSED_KILL": "1"}, check=False)
    assert child.returncode == -signal.SIGKILL, child.returncode
    instance = DagsterInstance.get()
    sensor = make_orphan_sensor([crash_job])
    # A code server evaluates every tick in one long-lived process, which builds and migrates its store on the
    # first: that tick finds nothing yet (the killed worker's deadline is ahead) and is shown apart.
    idle_files: dict[str, set[str]] = {}
    with build_sensor_context(instance=instance, resources=resources(url)) as ctx, traced(idle_files):
        assert not sensor.evaluate_tick(ctx).run_requests
    show("first tick in its process, nothing to recover (builds the store)", idle_files)
    store = recovery_ext.store.RecoveryStore(url)
    (pipeline,) = store.reports.list_pipelines()
    with store._db.write() as conn:  # the heartbeat timeout, waited out on the database clock
        from sqlalchemy import update

        from recovery_ext._store.schema import pipelines
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline.id)
                     .values(heartbeat_deadline=store.dialect.now_plus(-60)))
    tick_files: dict[str, set[str]] = {}
    with build_sensor_context(instance=instance, resources=resources(url)) as ctx, traced(tick_files):
        result = sensor.evaluate_tick(ctx)
    (request,) = result.run_requests
    show("recovery pass (the orphan-sensor tick that recovers it)", tick_files)
    resume_files: dict[str, set[str]] = {}
    with traced(resume_files):
        outcome = recovery_ext.testing.execute_in_process(crash_job, instance=instance, resources=resources(url),
                                                  run_config=request.run_config, tags=request.tags)
    assert outcome.success
    show("resume run (in process)", resume_files)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each file's name")
    parser.add_argument("--functions", action="store_true", help="print, under each file, the functions that ran")
    parser.add_argument("--postgres", action="store_true", help="on a scratch PostgreSQL database (default: SQLite)")
    parser.add_argument("--crash", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.crash:
        crash(args.crash)
        return

    def show(what: str, files: dict[str, set[str]]) -> None:
        print(f"{what}: {len(files)} files")
        for name in sorted(files) if args.list or args.functions else ():
            print(f"  {name}")
            for function in sorted(files[name]) if args.functions else ():
                print(f"      {function}")

    with tempfile.TemporaryDirectory() as home:
        os.environ["DAGSTER_HOME"] = home
        Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        if not args.postgres:
            url = f"sqlite:///{home}/recovery.sqlite3"
            recovery_ext.store.RecoveryStore(url).migrate()
            measure(url, show)
            return
        with scratch_store() as (url, _migrated):
            measure(url.replace("postgresql://", "postgresql+psycopg://", 1), show)


if __name__ == "__main__":
    main()
