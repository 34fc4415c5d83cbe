"""The repository API over SQLAlchemy Core: one class, one code path for both databases."""

from __future__ import annotations

import os
from pathlib import Path

from . import ontology_schema  # noqa: F401 - registers the ontology tables of migration 0002
from .orphan_store import OrphanOps
from .run_store import RunOps
from .queue_store import QueueOps
from .reports import ReportOps

URL_ENV = "RECOVERY_DATABASE_URL"


class RecoveryStore(OrphanOps, RunOps, QueueOps, ReportOps):
    """Pipelines, nodes, item checkpoints, the work queue, transitions and events.

    >>> store = RecoveryStore("sqlite:///recovery.sqlite3")
    >>> store.migrate()
    """


def default_database_url() -> str:
    """``$RECOVERY_DATABASE_URL``, else SQLite under ``$DAGSTER_HOME`` (or ``./.dagster_home``)."""
    url = os.environ.get(URL_ENV)
    if url:
        return url
    home = Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'recovery.sqlite3'}"
