"""The repository API over SQLAlchemy Core: one class, one code path for both databases."""

from __future__ import annotations

import os
from pathlib import Path

from recovery_ext._store.aggregates import AggregateOps
from recovery_ext._store.checkpoints import CheckpointOps
from recovery_ext._store.jobs import JobOps
from recovery_ext._store.journal import JournalOps
from recovery_ext._store.budgets import BudgetOps
from recovery_ext._store.ticks import TickOps
from recovery_ext._store.queue import QueueOps
from recovery_ext._store.observability import ObservabilityOps
from recovery_ext._store.reports import ReportOps
from recovery_ext._store.retention import RetentionOps
from recovery_ext._store.vouch import VouchOps

URL_ENV = "RECOVERY_DATABASE_URL"


class RecoveryStore(CheckpointOps, JournalOps, JobOps, TickOps, BudgetOps, QueueOps, ReportOps, ObservabilityOps,
                    AggregateOps,
                    VouchOps, RetentionOps):
    """Pipelines, nodes, item checkpoints, the work queue, transitions, events, circuit breakers, the ledger of
    provider calls, the call journal and the request and token budgets, the reads behind metrics and reports, and retention.

    Every public call that opens its own transaction is declared ``@retried`` where it is
    defined: re-run on transient database errors (a restart, a lost connection, a deadlock)
    for up to ``retry_budget`` seconds, by the shared classifier's judgement, with jittered
    backoff. Methods that take ``conn`` run inside their caller's transaction, and the
    caller's call is what retries.

    >>> store = RecoveryStore("sqlite:///recovery.sqlite3")
    >>> store.migrate()
    """


def default_database_url(*, create: bool = True) -> str:
    """``$RECOVERY_DATABASE_URL``, else SQLite under ``$DAGSTER_HOME`` (or ``./.dagster_home``).

    ``create=False`` only names that file: the folder is made only by a caller about to create the database.
    """
    url = os.environ.get(URL_ENV)
    if url:
        return url
    home = Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home")
    if create:
        home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'recovery.sqlite3'}"
