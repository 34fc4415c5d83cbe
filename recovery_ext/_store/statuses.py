"""The status of every row the store keeps, one enum per table family.

Each member is a ``str`` (``enum.StrEnum``) whose value is what the database column holds, so a
member compares equal to the column's text, binds as that text on both databases and encodes as
it in JSON. The SQL files (migrations and fixed statements) spell the same values.
"""

from __future__ import annotations

import enum


class PipelineStatus(enum.StrEnum):
    """``rx_pipelines.status``. A running pipeline may be paused by a provider outage: see :data:`WAITING`."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


class NodeStatus(enum.StrEnum):
    """``rx_nodes.status``: a node (one op or asset) of a pipeline."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEGRADED = "degraded"  # finished with a fallback answer; a later run may redo it
    SKIPPED = "skipped"  # the run succeeded without executing it (e.g. a branch not taken)


class ItemStatus(enum.StrEnum):
    """``rx_node_items.status``: a checkpointed item of a node."""

    COMPLETED = "completed"
    DEGRADED = "degraded"  # a fallback answer: kept, but asked again by the node's next run


class QueueStatus(enum.StrEnum):
    """``rx_queue_items.status``: an item of a work queue."""

    READY = "ready"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"  # failed for good (a permanent error)
    DEAD = "dead"  # out of attempts


class BreakerState(enum.StrEnum):
    """``rx_circuit_breakers.state``: a provider endpoint's circuit breaker."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class ItemOutcome(enum.StrEnum):
    """What a node counts about its items, reported as output metadata ``items_<outcome>``."""

    DONE = "done"
    RESUMED = "resumed"  # finished by an earlier run: skipped
    DEGRADED = "degraded"
    FAILED = "failed"
    DEAD = "dead"
    RELEASED = "released"  # a queue item an earlier epoch held, handed back


# What a running pipeline paused by a provider outage (waiting_until set) is shown as. Its stored
# status stays running, so liveness, fencing and orphan detection treat it like any live pipeline.
WAITING = "waiting"

FINISHED_PIPELINE_STATUSES = (PipelineStatus.COMPLETED, PipelineStatus.FAILED, PipelineStatus.CANCELED)
FINISHED_NODE_STATUSES = (NodeStatus.COMPLETED, NodeStatus.DEGRADED, NodeStatus.SKIPPED)
FINISHED_QUEUE_STATUSES = (QueueStatus.COMPLETED, QueueStatus.DEAD, QueueStatus.FAILED, ItemStatus.DEGRADED)
UNFINISHED_QUEUE_STATUSES = (QueueStatus.READY, QueueStatus.PROCESSING)


class JobStatus(enum.StrEnum):
    """What a provider's asynchronous job says of itself (``JobAdapter.status``), and what became of it in
    ``rx_provider_jobs.status`` (submitting, submitted, collected or how it ended)."""

    RUNNING = "running"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"
    SUBMITTING = "submitting"
    SUBMITTED = "submitted"
    COLLECTED = "collected"
