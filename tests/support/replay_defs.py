"""Jobs for the resume-only-what-is-left tests and bench/resume_bench.py.

``mixed``: recoverable ``a`` -> plain ``plain`` -> recoverable ``b`` -> recoverable ``c`` (a plain op
between recoverable ones has no node row: a resume runs it again). ``chain9``: nine recoverable
ops in a row. Each exists for the multiprocess and the in-process executor. Every business-logic
call is recorded in ``e2e_calls`` (run id, node, item, pid).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time

from dagster import (
    AssetKey,
    ConfigurableIOManager,
    ConfigurableResource,
    DailyPartitionsDefinition,
    Definitions,
    DynamicOut,
    DynamicOutput,
    Field,
    Out,
    asset,
    define_asset_job,
    in_process_executor,
    job,
    multiprocess_executor,
    op,
)

from e2e_defs import record_call
from recovery_ext import RecoveryResource, recoverable_op, with_recovery

NODE_CONFIG = {"items": Field(int, default_value=2), "item_seconds": Field(float, default_value=0.0),
               "fail_first_run": Field(bool, default_value=False,
                                       description="fail for good unless the run is a re-execution")}


def make_node(name: str, *, first: bool = False):
    def body(ctx, upstream=None):
        cfg = ctx.op_config
        if cfg["fail_first_run"] and not ctx.context.run.parent_run_id:
            raise ValueError(f"{name} fails in the first run")
        for item in ctx.items(f"{name}-{i}" for i in range(cfg["items"])):
            record_call(ctx._store, ctx.context.run_id, name, item.key)
            time.sleep(cfg["item_seconds"])
            item.complete({"item": item.key})
        chain = (upstream or {}).get("chain", [])
        return {"chain": [*chain, name], "items": sorted(ctx.completed_items())}

    body.__name__ = name
    return recoverable_op(name=name, config_schema=NODE_CONFIG, ins={} if first else None)(body)


@op(required_resource_keys={"recovery"})
def plain(context, upstream):
    """A plain op: no node row, so every run (a resume too) runs it."""
    record_call(context.resources.recovery.get_store(), context.run_id, "plain", "plain")
    return {**upstream, "chain": [*upstream["chain"], "plain"]}


a, b, c = make_node("a", first=True), make_node("b"), make_node("c")
CHAIN = [f"r{i}" for i in range(1, 10)]
chain_nodes = [make_node(CHAIN[0], first=True)] + [make_node(n) for n in CHAIN[1:]]


def _mixed():
    c(b(plain(a())))


def _chain9():
    value = chain_nodes[0]()
    for node in chain_nodes[1:]:
        value = node(value)


mixed_mp = job(name="mixed_mp", executor_def=with_recovery(multiprocess_executor))(_mixed)
mixed_inproc = job(name="mixed_inproc", executor_def=with_recovery(in_process_executor))(_mixed)
chain9_mp = job(name="chain9_mp", executor_def=with_recovery(multiprocess_executor))(_chain9)
chain9_inproc = job(name="chain9_inproc", executor_def=with_recovery(in_process_executor))(_chain9)

# ``stored``: a recoverable op whose output goes through an IO manager that needs a resource of its own,
# and whose body needs a resource nothing else in the job uses. A resume replays ``stored_first`` (its
# output is read by ``stored_second``) through that IO manager, and initializes only what storing it needs.
INITIALIZED: list[tuple[str, str]] = []  # (resource, run id), in this process (the in-process executor)


class BodyOnly(ConfigurableResource):
    """Used by the op body alone: a replay, which runs no body, does not need it."""

    def setup_for_execution(self, context) -> None:
        INITIALIZED.append(("body_only", context.run_id))


class Folder(ConfigurableResource):
    path: str

    def setup_for_execution(self, context) -> None:
        INITIALIZED.append(("folder", context.run_id))


class FolderIOManager(ConfigurableIOManager):
    """Stores each output as JSON in a folder given by a resource of its own."""

    folder: Folder

    def _file(self, context) -> str:
        return os.path.join(self.folder.path, f"{context.step_key}.{context.name}.json")

    def handle_output(self, context, obj) -> None:
        with open(self._file(context), "w", encoding="utf-8") as handle:
            json.dump(obj, handle)

    def load_input(self, context):
        with open(self._file(context.upstream_output), encoding="utf-8") as handle:
            return json.load(handle)


@recoverable_op(name="stored_first", ins={}, out=Out(io_manager_key="folder_io"))
def stored_first(ctx, body_only: BodyOnly):
    record_call(ctx._store, ctx.context.run_id, "stored_first", "only")
    return {"chain": ["stored_first"], "folder_io": True}


@recoverable_op(name="stored_second")
def stored_second(ctx, upstream):
    record_call(ctx._store, ctx.context.run_id, "stored_second", "only")
    return {**upstream, "chain": [*upstream["chain"], "stored_second"]}


def _stored():
    stored_second(stored_first())


stored_inproc = job(name="stored_inproc", executor_def=with_recovery(in_process_executor))(_stored)
STORED_FOLDER = tempfile.mkdtemp(prefix="rx_io_")  # this process's own (only an in-process job stores here)
atexit.register(shutil.rmtree, STORED_FOLDER, True)


daily = DailyPartitionsDefinition(start_date="2026-01-01")


@asset(partitions_def=daily)
def raw_rows() -> int:
    return 1


@asset(partitions_def=daily)
def row_summary(raw_rows: int) -> int:
    return raw_rows + 1


summary_assets = define_asset_job("summary_assets", selection=[raw_rows, row_summary], partitions_def=daily)
RAW_KEY = AssetKey("raw_rows")


def resource() -> RecoveryResource:
    return RecoveryResource(database_url=os.environ.get("RECOVERY_DATABASE_URL"), heartbeat_interval=0.5,
                            heartbeat_timeout=5, max_resumes=1000, max_retries=1, retry_initial_delay=0.01,
                            retry_max_delay=0.02)


defs = Definitions(jobs=[mixed_mp, mixed_inproc, chain9_mp, chain9_inproc, summary_assets, stored_inproc],
                   assets=[raw_rows, row_summary],
                   resources={"recovery": resource(), "body_only": BodyOnly(),
                              "folder_io": FolderIOManager(folder=Folder(path=STORED_FOLDER))})


def bound(name: str):
    """A job with its resources, for ``build_reconstructable_job``."""
    return defs.resolve_job_def(name)


@op(out=DynamicOut())
def fan_out():
    for index in range(2):
        yield DynamicOutput(index, mapping_key=str(index))


mapped = make_node("mapped")


@job(executor_def=with_recovery(in_process_executor))
def fan_out_job():
    fan_out().map(mapped)
