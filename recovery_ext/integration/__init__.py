"""The Dagster integration: resources, the run-level executor wrapper, recoverable ops, sensors.

Only this package (and the pipelines built on it) imports ``dagster``.
"""

from .assets import recoverable_asset, recoverable_multi_asset
from .executor import execute_in_process, recoverable_job, with_recovery
from .recoverable import NodeContext, recoverable_op
from .resources import RecoveryResource
from .sensors import ASSET_JOB, make_orphan_sensor, make_stuck_item_sensor

__all__ = ["ASSET_JOB", "NodeContext", "RecoveryResource", "execute_in_process", "make_orphan_sensor",
           "make_stuck_item_sensor", "recoverable_asset", "recoverable_job", "recoverable_multi_asset",
           "recoverable_op", "with_recovery"]
