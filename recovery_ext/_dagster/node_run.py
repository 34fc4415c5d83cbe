"""The bundles a recoverable node's execution passes along: what the node declares, and one run of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster import RetryPolicy

from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._store.interfaces import OpStore
from recovery_ext._dagster.resources import RecoveryResource


@dataclass(frozen=True)
class RecoveryOptions:
    """How a recoverable op or asset reaches its recovery resource, and the liveness and retries it asks for."""

    resource_key: str = "recovery"
    retry_policy: RetryPolicy | None = None
    heartbeat: HeartbeatSettings | None = None  # None: the resource's settings


@dataclass(frozen=True)
class NodeDefinition:
    """A node as its decorator declared it: its name, its body and what to do when it had already finished."""

    name: str
    body: Callable[..., Any]
    heartbeat: HeartbeatSettings | None = None  # None: the resource's settings
    optional: bool = False  # degrades instead of failing the pipeline
    on_skip: Callable[[Any], Any] | None = None  # what a finished node returns (default: its recorded output)


@dataclass(frozen=True)
class NodeRun:
    """One execution of a node in this step: what every stage after finding the pipeline needs."""

    context: Any  # Dagster's op or asset execution context
    store: OpStore
    resource: RecoveryResource
    settings: HeartbeatSettings  # the node's, else the resource's
    node: NodeDefinition

    @property
    def name(self) -> str:
        return self.node.name
