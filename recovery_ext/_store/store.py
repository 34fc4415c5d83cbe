"""The store: one Database and its five components, one code path for both databases (SQLAlchemy Core)."""

from __future__ import annotations

import os
import warnings
from contextlib import AbstractContextManager
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import Engine

from recovery_ext._store.ledger import LedgerOps
from recovery_ext._store.observability import Observability
from recovery_ext._store.reports import Reports
from recovery_ext._store.retention import Retention
from recovery_ext._store import migrations
from recovery_ext._store.breakers import Outages
from recovery_ext._store.budgets import RateBudgets
from recovery_ext._store.journal import CallJournal
from recovery_ext._store.spend_caps import SpendCapAccounts
from recovery_ext._store.database import DEFAULT_RETRY_BUDGET, Component, Database, shared_retry_budget
from recovery_ext._store.pipelines import PipelineCore
from recovery_ext._store.queue import Queue
from recovery_ext._store.recovery import Orphans, Recovery
from recovery_ext._store.vouch import Vouching
from recovery_ext._store.checkpoints import Checkpoints
from recovery_ext._store.jobs import ProviderJobs
from recovery_ext._store.ledger import LedgerWrites
from recovery_ext._store.models import (ErrorInfo, FencedTransaction, ItemCheckpoint, Node, NodeBeat, NodeSpec,
                                        Ownership, Pipeline, PipelineBeat, PipelineLimits, ProviderCall,
                                        ProviderJobRow, WatchedNode)
from recovery_ext._store.pipelines import PipelineNodes
from recovery_ext._store.runs import Runs

if TYPE_CHECKING:
    import datetime as dt

    from recovery_ext._store.models import (BreakerDecision, BudgetGrant, CapState, JournalHit, JournalWrite,
                                            ProviderLimits, Reopened, SpendCaps, SpendGrant, WaitKind)

URL_ENV = "RECOVERY_DATABASE_URL"


_M = TypeVar("_M", bound=Callable[..., Any])


def _doc_of(part: Callable[..., Any]) -> Callable[[_M], _M]:
    """The docstring of the part's method a component's method hands its call to (one text, in one place)."""
    def named(method: _M) -> _M:
        method.__doc__ = part.__doc__
        return method
    return named


class Pipelines(Component):
    """Pipelines, nodes, item checkpoints, owner runs, provider jobs and liveness: what an op, an asset and the
    heartbeat thread call (:class:`~recovery_ext._store.interfaces.PipelineStore`).

    A plain class holding its parts, each over the store's one database, and handing each call to the part that
    does it: ``nodes`` (pipelines and nodes, the fenced transaction, node transitions), ``runs`` (heartbeats,
    ownership by run, how a run ends), ``checkpoints`` (item checkpoints), ``jobs`` (provider jobs) and
    ``vouching`` (what a watcher says about its step processes). The parts share ``rows`` (the store's one
    :class:`PipelineCore`: the pipeline and node moves every component shares, with the fence and the node
    transitions, chosen from the dialect on first use) and ``ledger`` (its ledger's writes). Each part's calls are
    ``@retried`` where they are defined.
    """

    def __init__(self, db: Database, *, rows: PipelineCore) -> None:
        super().__init__(db)
        self.rows = rows
        self.ledger = rows.ledger
        fence = rows.fence
        self.nodes = PipelineNodes(db, rows=self.rows, fence=fence)
        self.runs = Runs(db, rows=self.rows, fence=fence)
        self.checkpoints = Checkpoints(db, rows=self.rows, fence=fence, ledger=self.ledger)
        self.jobs = ProviderJobs(db, fence=fence, ledger=self.ledger)
        self.vouching = Vouching(db)

    # -- nodes: PipelineNodes ----------------------------------------------------------------------------------

    @_doc_of(PipelineNodes.create_pipeline)
    def create_pipeline(self, job_name: str, node_specs: Sequence[NodeSpec | str], *, owner: str, params: Any = None,
                        origin_run_id: str | None = None, limits: PipelineLimits = PipelineLimits(),
                        deployment: str = "default") -> Ownership:
        return self.nodes.create_pipeline(job_name, node_specs, owner=owner, params=params, origin_run_id=origin_run_id,
                                          limits=limits, deployment=deployment)

    @_doc_of(PipelineNodes.attach)
    def attach(self, pipeline_id: int, run_id: str, *, resume_number: int,
               heartbeat_timeout: float = 90.0) -> Ownership:
        return self.nodes.attach(pipeline_id, run_id, resume_number=resume_number, heartbeat_timeout=heartbeat_timeout)

    @_doc_of(PipelineNodes.get_pipeline)
    def get_pipeline(self, pipeline_id: int) -> Pipeline:
        return self.nodes.get_pipeline(pipeline_id)

    @_doc_of(PipelineNodes.find_pipeline)
    def find_pipeline(self, origin_run_id: str) -> Pipeline | None:
        return self.nodes.find_pipeline(origin_run_id)

    @_doc_of(PipelineNodes.last_reclaim)
    def last_reclaim(self, pipeline_id: int) -> dict[str, Any] | None:
        return self.nodes.last_reclaim(pipeline_id)

    @_doc_of(PipelineNodes.list_nodes)
    def list_nodes(self, pipeline_id: int) -> list[Node]:
        return self.nodes.list_nodes(pipeline_id)

    @_doc_of(PipelineNodes.get_node)
    def get_node(self, pipeline_id: int, name: str) -> Node:
        return self.nodes.get_node(pipeline_id, name)

    @_doc_of(PipelineNodes.fenced)
    def fenced(self, own: Ownership) -> AbstractContextManager[FencedTransaction]:
        return self.nodes.fenced(own)

    @_doc_of(PipelineNodes.write_fenced)
    def write_fenced(self, own: Ownership, work: Callable[[FencedTransaction], Any]) -> Any:
        return self.nodes.write_fenced(own, work)

    @_doc_of(PipelineNodes.start_node)
    def start_node(
        self, own: Ownership, name: str, *, heartbeat_timeout: float = 90.0, stall_timeout: float | None = None
    ) -> Node:
        return self.nodes.start_node(own, name, heartbeat_timeout=heartbeat_timeout, stall_timeout=stall_timeout)

    @_doc_of(PipelineNodes.begin_node)
    def begin_node(self, run_id: str, name: str, *, heartbeat_timeout: float = 90.0,
                   stall_timeout: float | None = None) -> tuple[Ownership, Node, bool] | None:
        return self.nodes.begin_node(run_id, name, heartbeat_timeout=heartbeat_timeout, stall_timeout=stall_timeout)

    @_doc_of(PipelineNodes.complete_node)
    def complete_node(self, own: Ownership, name: str, output: Any = None, *, heartbeat_timeout: float | None = None,
                      calls: Sequence[Any] = ()) -> bool:
        return self.nodes.complete_node(own, name, output, heartbeat_timeout=heartbeat_timeout, calls=calls)

    @_doc_of(PipelineNodes.degrade_node)
    def degrade_node(self, own: Ownership, name: str, error: ErrorInfo, *,
                     heartbeat_timeout: float | None = None) -> bool:
        return self.nodes.degrade_node(own, name, error, heartbeat_timeout=heartbeat_timeout)

    @_doc_of(PipelineNodes.fail_node)
    def fail_node(self, own: Ownership, name: str, error: ErrorInfo, *, permanent: bool,
                  data: dict[str, Any] | None = None) -> None:
        return self.nodes.fail_node(own, name, error, permanent=permanent, data=data)

    @_doc_of(PipelineNodes.report_progress)
    def report_progress(self, own: Ownership, name: str, *, stall_timeout: float) -> None:
        return self.nodes.report_progress(own, name, stall_timeout=stall_timeout)

    # -- runs: Runs --------------------------------------------------------------------------------------------

    @_doc_of(Runs.pulse)
    def pulse(self, pipeline_beats: Iterable[PipelineBeat] = (), node_beats: Iterable[NodeBeat] = ()) -> set[int]:
        return self.runs.pulse(pipeline_beats, node_beats)

    @_doc_of(Runs.heartbeat)
    def heartbeat(self, beats: Sequence[tuple[Ownership, str | None]], timeout: float) -> set[int]:
        return self.runs.heartbeat(beats, timeout)

    @_doc_of(Runs.owned_by)
    def owned_by(self, run_id: str) -> Ownership | None:
        return self.runs.owned_by(run_id)

    @_doc_of(Runs.formerly_owned_by)
    def formerly_owned_by(self, run_id: str) -> int | None:
        return self.runs.formerly_owned_by(run_id)

    @_doc_of(Runs.take_over)
    def take_over(self, pipeline_id: int, run_id: str, *, owner_dead: Sequence[str] = (),
                  heartbeat_timeout: float = 90.0, reason: str | None = None) -> Ownership:
        return self.runs.take_over(pipeline_id, run_id, owner_dead=owner_dead, heartbeat_timeout=heartbeat_timeout,
                                   reason=reason)

    @_doc_of(Runs.complete_run)
    def complete_run(self, own: Ownership) -> list[str]:
        return self.runs.complete_run(own)

    @_doc_of(Runs.fail_run)
    def fail_run(self, own: Ownership, error: str) -> None:
        return self.runs.fail_run(own, error)

    @_doc_of(Runs.cancel_run)
    def cancel_run(self, own: Ownership, reason: str) -> None:
        return self.runs.cancel_run(own, reason)

    # -- checkpoints: Checkpoints ------------------------------------------------------------------------------

    @_doc_of(Checkpoints.start_items)
    def start_items(self, own: Ownership, node_name: str, total: int) -> dict[str, str]:
        return self.checkpoints.start_items(own, node_name, total)

    @_doc_of(Checkpoints.completed_items)
    def completed_items(self, pipeline_id: int, node_name: str) -> dict[str, Any]:
        return self.checkpoints.completed_items(pipeline_id, node_name)

    @_doc_of(Checkpoints.checkpoint_item)
    def checkpoint_item(self, own: Ownership, node_name: str, entry: ItemCheckpoint, *,
                        stall_timeout: float | None = None) -> None:
        return self.checkpoints.checkpoint_item(own, node_name, entry, stall_timeout=stall_timeout)

    @_doc_of(Checkpoints.checkpoint_items)
    def checkpoint_items(self, own: Ownership, node_name: str, entries: Sequence[ItemCheckpoint], *,
                         stall_timeout: float | None = None) -> None:
        return self.checkpoints.checkpoint_items(own, node_name, entries, stall_timeout=stall_timeout)

    # -- jobs: ProviderJobs ------------------------------------------------------------------------------------

    @_doc_of(ProviderJobs.provider_jobs)
    def provider_jobs(self, pipeline_id: int, node_name: str | None = None) -> list[ProviderJobRow]:
        return self.jobs.provider_jobs(pipeline_id, node_name)

    @_doc_of(ProviderJobs.job_live)
    def job_live(self, own: Ownership, node_name: str, provider: str) -> ProviderJobRow | None:
        return self.jobs.job_live(own, node_name, provider)

    @_doc_of(ProviderJobs.job_submitting)
    def job_submitting(self, own: Ownership, node_name: str, *, token: str, provider: str, items: Sequence[str],
                       attempt: int, call: ProviderCall) -> None:
        return self.jobs.job_submitting(own, node_name, token=token, provider=provider, items=items, attempt=attempt,
                                        call=call)

    @_doc_of(ProviderJobs.job_submitted)
    def job_submitted(self, own: Ownership, node_name: str, token: str, job_id: str, *, outcome: str) -> None:
        return self.jobs.job_submitted(own, node_name, token, job_id, outcome=outcome)

    @_doc_of(ProviderJobs.job_part)
    def job_part(self, own: Ownership, node_name: str, token: str, item: str, part: str | None) -> None:
        return self.jobs.job_part(own, node_name, token, item, part)

    @_doc_of(ProviderJobs.job_part_lost)
    def job_part_lost(self, own: Ownership, node_name: str, token: str, item: str, call: ProviderCall) -> None:
        return self.jobs.job_part_lost(own, node_name, token, item, call)

    @_doc_of(ProviderJobs.job_finished)
    def job_finished(self, own: Ownership, node_name: str, token: str, status: str,
                     calls: Sequence[ProviderCall] = ()) -> None:
        return self.jobs.job_finished(own, node_name, token, status, calls)

    # -- vouching: Vouching ------------------------------------------------------------------------------------

    @_doc_of(Vouching.watched_nodes)
    def watched_nodes(self, watcher: str) -> list[WatchedNode]:
        return self.vouching.watched_nodes(watcher)

    @_doc_of(Vouching.vouch_nodes)
    def vouch_nodes(self, watcher: str, alive: Sequence[WatchedNode], dead: Sequence[WatchedNode],
                    timeout: float) -> int:
        return self.vouching.vouch_nodes(watcher, alive, dead, timeout)

    @_doc_of(Vouching.leave_to_recovery)
    def leave_to_recovery(self, own: Ownership) -> bool:
        return self.vouching.leave_to_recovery(own)


class Providers(Component):
    """Circuit breakers, the outage pause, the request and token budgets, the spend caps, the call journal and
    the ledger's writes: what a provider guard calls (:class:`~recovery_ext._store.interfaces.ProviderStore`).

    Each call goes to one of its parts, each a plain class over the one Database holding what it uses:
    ``outages`` (:class:`Outages`: the fence, and the dialect's node steps for the breaker read), ``journal``
    (:class:`CallJournal`: the ledger's writes), ``budgets`` (:class:`RateBudgets`) and ``caps``
    (:class:`SpendCapAccounts`: the fence). The fence, the node steps and the ledger's writes are those of the
    store's one :class:`PipelineCore` (``rows``), which the pipelines component shares. Each part's public calls
    are ``@retried`` where they are defined."""

    def __init__(self, db: Database, *, rows: PipelineCore) -> None:
        super().__init__(db)
        fence = rows.fence
        self.outages = Outages(db, fence=fence, rows=rows)
        self.journal = CallJournal(db, ledger=rows.ledger)
        self.budgets = RateBudgets(db)
        self.caps = SpendCapAccounts(db, fence=fence)

    @_doc_of(RateBudgets.budget_reserve)
    def budget_reserve(self, endpoint: str, model: str | None, *, tokens: int, limits: ProviderLimits,
                       holder: str | None = None, own: Ownership | None = None) -> BudgetGrant:
        return self.budgets.budget_reserve(endpoint, model, tokens=tokens, limits=limits, holder=holder, own=own)

    @_doc_of(RateBudgets.budget_back_off)
    def budget_back_off(self, endpoint: str, model: str | None, *, limits: ProviderLimits,
                        retry_after: float | None = None, max_delay: float | None = None) -> float:
        return self.budgets.budget_back_off(endpoint, model, limits=limits, retry_after=retry_after,
                                            max_delay=max_delay)

    @_doc_of(RateBudgets.budget_settle)
    def budget_settle(self, reservation: int, tokens: int) -> None:
        return self.budgets.budget_settle(reservation, tokens)

    @_doc_of(RateBudgets.budget_answered)
    def budget_answered(self, reservation: int) -> None:
        return self.budgets.budget_answered(reservation)

    @_doc_of(RateBudgets.budget_release)
    def budget_release(self, reservation: int) -> None:
        return self.budgets.budget_release(reservation)

    @_doc_of(RateBudgets.show_budget_wait)
    def show_budget_wait(self, own: Ownership, seconds: float, reason: str, *, node: str | None = None) -> bool:
        return self.budgets.show_budget_wait(own, seconds, reason, node=node)

    @_doc_of(RateBudgets.clear_budget_wait)
    def clear_budget_wait(self, own: Ownership, *, node: str | None = None) -> bool:
        return self.budgets.clear_budget_wait(own, node=node)

    @_doc_of(SpendCapAccounts.spend_configure)
    def spend_configure(self, own: Ownership, caps: SpendCaps) -> list[str]:
        return self.caps.spend_configure(own, caps)

    @_doc_of(SpendCapAccounts.spend_caps_over)
    def spend_caps_over(self, pipeline_id: int) -> bool:
        return self.caps.spend_caps_over(pipeline_id)

    @_doc_of(SpendCapAccounts.spend_reserve)
    def spend_reserve(self, own: Ownership, scopes: Sequence[str], *, tokens: int, cost: float | None = 0.0,
                      ref: str | None = None) -> SpendGrant:
        return self.caps.spend_reserve(own, scopes, tokens=tokens, cost=cost, ref=ref)

    @_doc_of(SpendCapAccounts.spend_settle)
    def spend_settle(self, reservations: Sequence[int], *, tokens: int, cost: float | None) -> None:
        return self.caps.spend_settle(reservations, tokens=tokens, cost=cost)

    @_doc_of(SpendCapAccounts.spend_settle_ref)
    def spend_settle_ref(self, ref: str, *, tokens: int, cost: float | None) -> int:
        return self.caps.spend_settle_ref(ref, tokens=tokens, cost=cost)

    @_doc_of(SpendCapAccounts.spend_add)
    def spend_add(self, scopes: Sequence[str], *, tokens: int, cost: float | None) -> None:
        return self.caps.spend_add(scopes, tokens=tokens, cost=cost)

    @_doc_of(SpendCapAccounts.spend_release)
    def spend_release(self, reservations: Sequence[int]) -> None:
        return self.caps.spend_release(reservations)

    @_doc_of(SpendCapAccounts.spend_cap)
    def spend_cap(self, scope: str) -> CapState | None:
        return self.caps.spend_cap(scope)

    @_doc_of(SpendCapAccounts.spend_caps)
    def spend_caps(self, scopes: Sequence[str] | None = None) -> list[CapState]:
        return self.caps.spend_caps(scopes)

    @_doc_of(SpendCapAccounts.spend_cap_set)
    def spend_cap_set(self, scope: str, *, tokens: int | None | bool = False, cost: float | None | bool = False,
                      who: str = "operator") -> CapState:
        return self.caps.spend_cap_set(scope, tokens=tokens, cost=cost, who=who)

    @_doc_of(SpendCapAccounts.show_wait)
    def show_wait(self, own: Ownership, seconds: float, reason: str, *, kind: WaitKind, node: str | None = None,
                  first: bool = True) -> dt.datetime | None:
        return self.caps.show_wait(own, seconds, reason, kind=kind, node=node, first=first)

    @_doc_of(SpendCapAccounts.clear_wait)
    def clear_wait(self, own: Ownership, *, kind: WaitKind, node: str | None = None) -> bool:
        return self.caps.clear_wait(own, kind=kind, node=node)

    @_doc_of(CallJournal.journal_begin)
    def journal_begin(self, own: Ownership, call: ProviderCall, *, call_key: str | None) -> JournalHit | None:
        return self.journal.journal_begin(own, call, call_key=call_key)

    @_doc_of(CallJournal.journal_answer)
    def journal_answer(self, own: Ownership, call: ProviderCall, *, call_key: str | None, answer: str | None) -> None:
        return self.journal.journal_answer(own, call, call_key=call_key, answer=answer)

    @_doc_of(CallJournal.journal_writes)
    def journal_writes(self, own: Ownership, writes: Sequence[JournalWrite]) -> list[JournalHit | None | Exception]:
        return self.journal.journal_writes(own, writes)

    @_doc_of(CallJournal.complete_calls)
    def complete_calls(self, calls: Sequence[ProviderCall]) -> None:
        return self.journal.complete_calls(calls)

    @_doc_of(CallJournal.prune_call_journal)
    def prune_call_journal(self, pipeline_id: int | None = None) -> int:
        return self.journal.prune_call_journal(pipeline_id)

    @_doc_of(CallJournal.record_provider_calls)
    def record_provider_calls(self, calls: Sequence[ProviderCall]) -> None:
        return self.journal.record_provider_calls(calls)

    @_doc_of(Outages.breaker_before_call)
    def breaker_before_call(self, endpoint: str, who: str, *, probe_timeout: float,
                            poll_seconds: float = 2.0) -> BreakerDecision:
        return self.outages.breaker_before_call(endpoint, who, probe_timeout=probe_timeout, poll_seconds=poll_seconds)

    @_doc_of(Outages.breaker_record_success)
    def breaker_record_success(self, endpoint: str, who: str, decision: BreakerDecision) -> bool:
        return self.outages.breaker_record_success(endpoint, who, decision)

    @_doc_of(Outages.breaker_record_failure)
    def breaker_record_failure(self, endpoint: str, who: str, *, threshold: int, cooldown: Any,
                               error: str) -> str | None:
        return self.outages.breaker_record_failure(endpoint, who, threshold=threshold, cooldown=cooldown, error=error)

    @_doc_of(Outages.breakers)
    def breakers(self) -> list[dict[str, Any]]:
        return self.outages.breakers()

    @_doc_of(Outages.set_waiting)
    def set_waiting(self, own: Ownership, seconds: float, reason: str, *, node: str | None = None) -> dt.datetime:
        return self.outages.set_waiting(own, seconds, reason, node=node)

    @_doc_of(Outages.clear_waiting)
    def clear_waiting(self, own: Ownership, *, node: str | None = None, keep_outage_clock: bool = False,
                      event: str | None = None) -> bool:
        return self.outages.clear_waiting(own, node=node, keep_outage_clock=keep_outage_clock, event=event)

    @_doc_of(Outages.end_outage_clock)
    def end_outage_clock(self, own: Ownership, *, node: str | None = None) -> bool:
        return self.outages.end_outage_clock(own, node=node)

    @_doc_of(Outages.waiting_seconds)
    def waiting_seconds(self, pipeline_id: int) -> float | None:
        return self.outages.waiting_seconds(pipeline_id)

    @_doc_of(Outages.waiting_pipelines)
    def waiting_pipelines(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return self.outages.waiting_pipelines(limit=limit)

    @_doc_of(Outages.degraded_counts)
    def degraded_counts(self, pipeline_id: int) -> dict[str, int]:
        return self.outages.degraded_counts(pipeline_id)

    @_doc_of(Outages.reopen_degraded)
    def reopen_degraded(self, pipeline_id: int, node: str | None = None, *, grace_seconds: float = 300.0) -> Reopened:
        return self.outages.reopen_degraded(pipeline_id, node, grace_seconds=grace_seconds)


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
        # One PipelineCore (the fence, the node and pipeline moves, the node steps and the ledger's writes),
        # handed to every component that writes for an owner: one choice of node steps, one fence.
        rows = PipelineCore(self._db, ledger=LedgerWrites(self._db))
        self.pipelines = Pipelines(self._db, rows=rows)
        self.providers = Providers(self._db, rows=rows)
        self.queue = Queue(self._db)
        self.recovery = Recovery(self._db, orphans=Orphans(self._db), pipeline_rows=rows)
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
