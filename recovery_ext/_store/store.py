"""The store: one Database and its five components, one code path for both databases (SQLAlchemy Core)."""

from __future__ import annotations

import os
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Engine

from recovery_ext._store.ledger import LedgerOps
from recovery_ext._store.observability import Observability
from recovery_ext._store.reports import Reports
from recovery_ext._store.retention import Retention
from recovery_ext._store import migrations
from recovery_ext._store.spend_caps import SpendCapOps
from recovery_ext._store.database import DEFAULT_RETRY_BUDGET, Database, shared_retry_budget
from recovery_ext._store.deployments import Deployments
from recovery_ext._store.orphans import Orphans
from recovery_ext._store.pipelines import PipelineCore
from recovery_ext._store.queue import Queue
from recovery_ext._store.ticks import Recovery
from recovery_ext._store.vouch import VouchOps

URL_ENV = "RECOVERY_DATABASE_URL"


class Pipelines(VouchOps):
    """Pipelines, nodes, item checkpoints, owner runs, provider jobs and liveness: what an op, an asset and the
    heartbeat thread call (:class:`~recovery_ext._store.interfaces.PipelineStore`)."""


class Providers(SpendCapOps):
    """Circuit breakers, the outage pause, the request and token budgets, the spend caps, the call journal and
    the ledger's writes: what a provider guard calls (:class:`~recovery_ext._store.interfaces.ProviderStore`)."""


# The transaction helpers of the one Database that RecoveryStore offered as public names before 0.x: each still
# answers, through the store's database, with a DeprecationWarning, for one release.
_DEPRECATED_HELPERS = frozenset({
    "write", "read", "read_statement", "autocommit", "driver_autocommit", "driver_of", "wrap_error",
    "wrap_driver_error", "record_transitions", "record_events", "record_event", "upsert"})


class RecoveryStore:
    """The store: one :class:`Database` (engine, dialect, retry budget) and five components over it.

    ``pipelines`` (ops, assets, the heartbeat), ``providers`` (provider guards), ``queue`` (work queues),
    ``recovery`` (the sensors' recovery pass) and ``reports`` (CLI, metrics, reports, retention). Each is one
    caller's interface; none inherits another. Besides them the store offers its lifecycle only: ``migrate``,
    ``check_schema``, ``pending_migrations``, ``read_only`` and ``close`` (or ``with``).

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
        self._db = Database(url, echo=echo, engine=engine, retry_budget=retry_budget,
                            connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        self.url = self._db.url
        self.dialect = self._db.dialect
        self.engine = self._db.engine
        self.pipelines = Pipelines(self._db)
        self.providers = Providers(self._db)
        self.queue = Queue(self._db)
        self.recovery = Recovery(self._db, orphans=Orphans(self._db), deployments=Deployments(self._db),
                                 pipeline_rows=PipelineCore(self._db))
        ledger = LedgerOps(self._db)
        self.reports = Reports(self._db, ledger=ledger, observability=Observability(self._db, ledger=ledger),
                               retention=Retention(self._db))

    retry_budget = shared_retry_budget()

    def migrate(self, package: str = migrations.LIBRARY) -> list[migrations.Migration]:
        """Apply the library's pending migrations, or those of an application ``package`` (after the library's)."""
        return self._db.migrate(package)

    def check_schema(self) -> None:
        """Raise MigrationError when a newer release migrated this database (its tables are not this code's)."""
        self._db.check_schema()

    def pending_migrations(self, package: str = migrations.LIBRARY) -> list[migrations.Migration]:
        return self._db.pending_migrations(package)

    def read_only(self) -> AbstractContextManager[Connection]:
        """A transaction the database itself refuses to write in (what op code gets for reads)."""
        return self._db.read_only()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RecoveryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dialect.safe_url()!r})"

    def __getattr__(self, name: str) -> Any:
        if name in _DEPRECATED_HELPERS:
            warnings.warn(f"RecoveryStore.{name} is internal and goes in the next release; the components "
                          "(store.pipelines, .providers, .queue, .recovery, .reports) hold the store's calls",
                          DeprecationWarning, stacklevel=2)
            return getattr(self._db, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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
