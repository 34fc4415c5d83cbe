"""The repository API over SQLAlchemy Core: one class, one code path for both databases."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from . import ontology_schema  # noqa: F401 - registers the ontology tables of migration 0002
from .checkpoint_store import CheckpointOps
from .database import retried
from .orphan_store import OrphanOps
from .provider_store import ProviderOps
from .run_store import RunOps
from .queue_store import QueueOps
from .reports import ReportOps

URL_ENV = "RECOVERY_DATABASE_URL"

# Not store calls of their own: transaction context managers and helpers that run inside
# the caller's transaction (they take ``conn``), so the caller's call is what retries.
_NOT_RETRIED = frozenset({"read", "read_only", "write", "autocommit", "driver_autocommit", "fenced", "close",
                          "wrap_error", "wrap_driver_error", "migrate", "pending_migrations"})


class RecoveryStore(CheckpointOps, OrphanOps, RunOps, ProviderOps, QueueOps, ReportOps):
    """Pipelines, nodes, item checkpoints, the work queue, transitions, events and circuit breakers.

    Every public call is one transaction, re-run on transient database errors (a restart,
    a lost connection, a deadlock) for up to ``retry_budget`` seconds, by the shared
    classifier's judgement, with jittered backoff.

    >>> store = RecoveryStore("sqlite:///recovery.sqlite3")
    >>> store.migrate()
    """


def _retry_every_store_call(cls: type) -> None:
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_") or name in _NOT_RETRIED or getattr(member, "__rx_retried__", False):
            continue
        if "conn" in inspect.signature(member).parameters:
            continue
        setattr(cls, name, retried(member))


_retry_every_store_call(RecoveryStore)


def default_database_url() -> str:
    """``$RECOVERY_DATABASE_URL``, else SQLite under ``$DAGSTER_HOME`` (or ``./.dagster_home``)."""
    url = os.environ.get(URL_ENV)
    if url:
        return url
    home = Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'recovery.sqlite3'}"
