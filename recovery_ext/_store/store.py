"""The repository API over SQLAlchemy Core: one class, one code path for both databases."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import Engine

from recovery_ext._store.retention import RetentionOps
from recovery_ext._store.database import DEFAULT_RETRY_BUDGET, Database
from recovery_ext._store.queue import QueueOps
from recovery_ext._store.spend_caps import SpendCapOps
from recovery_ext._store.ticks import TickOps
from recovery_ext._store.vouch import VouchOps

URL_ENV = "RECOVERY_DATABASE_URL"


class Pipelines(VouchOps):
    """Pipelines, nodes, item checkpoints, owner runs, provider jobs and liveness: what an op, an asset and the
    heartbeat thread call (:class:`~recovery_ext._store.interfaces.PipelineStore`)."""


class Providers(SpendCapOps):
    """Circuit breakers, the outage pause, the request and token budgets, the spend caps, the call journal and
    the ledger's writes: what a provider guard calls (:class:`~recovery_ext._store.interfaces.ProviderStore`)."""


class Queue(QueueOps):
    """The work queue (:class:`~recovery_ext._store.interfaces.QueueStore`)."""


class Recovery(TickOps):
    """The orphan sensor's snapshot and recovery pass
    (:class:`~recovery_ext._store.interfaces.RecoveryPassStore`)."""


class Reports(RetentionOps):
    """Reads for the CLI, metrics and reports, events, and retention
    (:class:`~recovery_ext._store.interfaces.ReportStore`)."""


class RecoveryStore(Database):
    """The store: one :class:`Database` (engine, dialect, retry budget) and five components over it.

    ``pipelines`` (ops, assets, the heartbeat), ``providers`` (provider guards), ``queue`` (work queues),
    ``recovery`` (the sensors' recovery pass) and ``reports`` (CLI, metrics, reports, retention). Each is one
    caller's interface; none inherits another.

    Every public call that opens its own transaction is declared ``@retried`` where it is
    defined: re-run on transient database errors (a restart, a lost connection, a deadlock)
    for up to ``retry_budget`` seconds, by the shared classifier's judgement, with jittered
    backoff. Methods that take ``conn`` run inside their caller's transaction, and the
    caller's call is what retries.

    >>> store = RecoveryStore("sqlite:///recovery.sqlite3")
    >>> store.migrate()
    """

    def __init__(self, url: str, *, echo: bool = False, engine: Engine | None = None,
                 retry_budget: float = DEFAULT_RETRY_BUDGET, connect_timeout: float | None = None,
                 statement_timeout: float | None = None) -> None:
        super().__init__(url, echo=echo, engine=engine, retry_budget=retry_budget, connect_timeout=connect_timeout,
                         statement_timeout=statement_timeout)
        self.pipelines = Pipelines(self)
        self.providers = Providers(self)
        self.queue = Queue(self)
        self.recovery = Recovery(self)
        self.reports = Reports(self)


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
