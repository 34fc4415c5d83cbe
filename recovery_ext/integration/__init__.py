"""The Dagster integration: resources, recoverable ops and sensor factories.

Only this package (and the pipelines built on it) imports ``dagster``.
"""

from .recoverable import NodeContext, recoverable_op
from .resources import RecoveryResource
from .sensors import make_orphan_sensor, make_stuck_item_sensor

__all__ = ["NodeContext", "RecoveryResource", "make_orphan_sensor", "make_stuck_item_sensor", "recoverable_op"]
