"""A code location with a partitioned recoverable asset (10 partitions of 4 items), its asset job
(in-process executor: a kill -9 of the run worker kills the step with it) and the orphan sensor,
for tests/test_assets_e2e.py under a real `dagster dev`."""

from __future__ import annotations

import time

from dagster import Config, Definitions, EnvVar, StaticPartitionsDefinition, define_asset_job, in_process_executor

from e2e_defs import record_call
from recovery_ext.integration import NodeContext, RecoveryResource, make_orphan_sensor, recoverable_asset, with_recovery

PARTITIONS = StaticPartitionsDefinition([f"part-{i}" for i in range(10)])


class BatchConfig(Config):
    items: int = 4
    item_seconds: float = 0.5


@recoverable_asset(partitions_def=PARTITIONS)
def batch(ctx: NodeContext, config: BatchConfig) -> dict:
    partition = ctx.context.partition_key
    for item in ctx.items(f"{partition}/{i}" for i in range(config.items)):
        record_call(ctx._store, ctx.context.run_id, partition, item.key)
        time.sleep(config.item_seconds)
        item.complete({"run": ctx.context.run_id})
    return {"partition": partition, "items": sorted(ctx.completed_items())}


batch_job = define_asset_job("batch_job", selection=[batch], partitions_def=PARTITIONS,
                             executor_def=with_recovery(in_process_executor))

defs = Definitions(
    assets=[batch], jobs=[batch_job],
    sensors=[make_orphan_sensor([batch_job], minimum_interval_seconds=1)],
    resources={"recovery": RecoveryResource(database_url=EnvVar("RECOVERY_DATABASE_URL"), heartbeat_interval=2.0,
                                            heartbeat_timeout=15.0, max_resumes=3, launch_grace_seconds=60)},
)
