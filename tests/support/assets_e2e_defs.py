"""A code location for tests/test_assets_e2e.py under a real `dagster dev`: a partitioned recoverable
asset (10 partitions of 4 items) with its asset job and orphan sensor (a job backfill), and two
chained partitioned recoverable assets (4 partitions) that an asset backfill runs in Dagster's
implicit asset job, resumed by the orphan sensor for ``ASSET_JOB``. In-process executors: a kill -9
of the run worker kills the step with it."""

from __future__ import annotations

import time

from dagster import (
    Config,
    Definitions,
    EnvVar,
    MaterializeResult,
    StaticPartitionsDefinition,
    define_asset_job,
    in_process_executor,
)

from e2e_defs import record_call
from recovery_ext import (
    ASSET_JOB,
    NodeContext,
    RecoveryResource,
    make_orphan_sensor,
    recoverable_asset,
    with_recovery,
)

PARTITIONS = StaticPartitionsDefinition([f"part-{i}" for i in range(10)])
BOOKS = StaticPartitionsDefinition([f"book-{i}" for i in range(4)])
# Long enough that a partition stays mid-way (some items done, not all) for seconds even on a loaded machine,
# where the test's kill must land inside that window.
ITEM_SECONDS = 1.0


class BatchConfig(Config):
    items: int = 4
    item_seconds: float = 1.0  # see ITEM_SECONDS


@recoverable_asset(partitions_def=PARTITIONS)
def batch(ctx: NodeContext, config: BatchConfig) -> dict:
    partition = ctx.context.partition_key
    for item in ctx.items(f"{partition}/{i}" for i in range(config.items)):
        record_call(ctx._store, ctx.context.run_id, partition, item.key)
        time.sleep(config.item_seconds)
        item.complete({"run": ctx.context.run_id})
    return {"partition": partition, "items": sorted(ctx.completed_items())}


@recoverable_asset(partitions_def=BOOKS)
def pages(ctx: NodeContext) -> dict:
    book = ctx.context.partition_key
    for item in ctx.items(f"{book}/page-{i}" for i in range(3)):
        record_call(ctx._store, ctx.context.run_id, "pages", item.key)
        time.sleep(ITEM_SECONDS)
        item.complete(len(item.key))
    return {"book": book, "pages": sorted(ctx.completed_items())}


@recoverable_asset(partitions_def=BOOKS)
def page_index(ctx: NodeContext, pages: dict) -> MaterializeResult:
    """Downstream of ``pages`` in the same run: a kill here leaves ``pages`` finished."""
    for item in ctx.items(f"{page}/index" for page in pages["pages"]):
        record_call(ctx._store, ctx.context.run_id, "page_index", item.key)
        time.sleep(ITEM_SECONDS)
        item.complete()
    return MaterializeResult(metadata={"indexed": len(ctx.completed_items()), "book": pages["book"]})


batch_job = define_asset_job("batch_job", selection=[batch], partitions_def=PARTITIONS,
                             executor_def=with_recovery(in_process_executor))

defs = Definitions(
    assets=[batch, pages, page_index], jobs=[batch_job],
    executor=with_recovery(in_process_executor),  # the implicit asset job's: what asset backfills run
    sensors=[make_orphan_sensor([batch_job], minimum_interval_seconds=1),
             make_orphan_sensor([ASSET_JOB], minimum_interval_seconds=1)],
    resources={"recovery": RecoveryResource(database_url=EnvVar("RECOVERY_DATABASE_URL"), heartbeat_interval=2.0,
                                            heartbeat_timeout=15.0, max_resumes=3, launch_grace_seconds=60)},
)
