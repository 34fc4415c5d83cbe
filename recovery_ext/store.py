"""The store, for tools that work without Dagster: the application tables, their value types and statuses,
the recovery scan, and the SQLAlchemy column types an application's own tables can share.

>>> from recovery_ext.store import RecoveryStore
>>> store = RecoveryStore("sqlite:///recovery.sqlite3")
>>> store.migrate()

``RecoveryStore`` shows its five components (``store.pipelines``, ``.providers``, ``.queue``, ``.recovery``,
``.reports``, each one of the protocols below) and its lifecycle; everything else is private.
"""

from __future__ import annotations

from recovery_ext._recovery.protocol import scan
from recovery_ext._recovery.protocol import RecoverySettings
from recovery_ext._store.interfaces import (PipelineStore, ProviderStore, QueueStore, RecoveryPassStore,
                                            ReportStore)
from recovery_ext._store.models import ItemCheckpoint, NodeSpec, Ownership, PassPlan, PipelineLimits, Scope
from recovery_ext._store.queue import LEGACY_STALE_SECONDS, validate_backoff
from recovery_ext._store.dialects import DbJson, DbTime
from recovery_ext._store.statuses import (WAITING, BreakerState, ItemOutcome, ItemStatus, NodeStatus, PipelineStatus,
                                          QueueStatus)
from recovery_ext._store.store import RecoveryStore

__all__ = [
    "LEGACY_STALE_SECONDS",
    "WAITING",
    "BreakerState",
    "DbJson",
    "DbTime",
    "ItemCheckpoint",
    "ItemOutcome",
    "ItemStatus",
    "NodeSpec",
    "NodeStatus",
    "Ownership",
    "PassPlan",
    "PipelineLimits",
    "PipelineStatus",
    "PipelineStore",
    "ProviderStore",
    "QueueStatus",
    "QueueStore",
    "RecoveryPassStore",
    "RecoverySettings",
    "RecoveryStore",
    "ReportStore",
    "Scope",
    "scan",
    "validate_backoff",
]
