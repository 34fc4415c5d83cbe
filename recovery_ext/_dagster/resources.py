"""The ``recovery`` resource: where the application tables live and how liveness is judged."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dagster import ConfigurableResource, DagsterInstance
from pydantic import ConfigDict, Field, model_validator

from recovery_ext._settings import DAY, check_count, check_deployment, check_seconds
from recovery_ext._errors import ConfigurationError
from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._providers.guard import OutageSettings
from recovery_ext._recovery.protocol import RecoverySettings
from recovery_ext._classify.redaction import redact
from recovery_ext._classify.retry import RetryPolicy, wait_jittered_exponential
from recovery_ext._store.migrations import check_package
from recovery_ext._store.models import IN_PROCESS_DEPLOYMENT, PipelineLimits
from recovery_ext._store.models import SpendCaps
from recovery_ext._store.store import RecoveryStore, default_database_url

log = logging.getLogger("recovery_ext.resources")

_stores: dict[str, RecoveryStore] = {}
_stores_lock = threading.Lock()


_migrated_packages: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class _Settings:
    """The settings values one configuration of the resource stands for, built (and so checked) together."""

    heartbeat: HeartbeatSettings
    recovery: RecoverySettings
    limits: PipelineLimits
    outage: OutageSettings
    spend_caps: SpendCaps


# Dagster builds the resource again from the same config for every sensor tick, run and step. Its checks are a
# pure function of its fields, so each configuration is checked, and its settings values built, once per
# process, not at every build.
_checked_configs: dict[tuple[tuple[str, Any], ...], _Settings] = {}
_MAX_CHECKED_CONFIGS = 256

DEPLOYMENT_ENV = "RECOVERY_DEPLOYMENT"


def derived_deployment(instance: DagsterInstance | None) -> str:
    """A stable name for a Dagster instance: its run storage's id (one per run database), else its home folder.

    Two deployments are two run storages; the same instance seen from the daemon, the webserver and
    every run worker derives the same name.
    """
    storage_id = None
    # the SQL run storages have an id; RunStorage itself does not declare one
    get_id = getattr(instance.run_storage, "get_run_storage_id", None) if instance is not None else None
    try:
        storage_id = get_id() if get_id is not None else None
    except Exception:  # noqa: BLE001 - a run storage without an id: fall back to the instance's folder
        storage_id = None
    if storage_id:
        return f"dagster-{str(storage_id)[:8]}"
    root = getattr(instance, "root_directory", None) or "default"
    return "dagster-" + hashlib.sha256(str(root).encode()).hexdigest()[:8]


def in_process_deployment(resource: RecoveryResource) -> str:
    """An in-process run's deployment given no instance: the one named, else that of ``$DAGSTER_HOME``'s instance.

    ``dagster dev`` or the daemon started with the same ``DAGSTER_HOME`` derives the same name, so its
    orphan sensor adopts the pipeline of a killed in-process run. Dagster's own ``execute_in_process``
    runs on a throw-away instance; its name would strand every crash.
    """
    if resource.deployment or os.environ.get(DEPLOYMENT_ENV):
        return resource.deployment_name(None)
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return IN_PROCESS_DEPLOYMENT
    with _home_lock:  # threads starting runs at once would each create a fresh home's storage: a race
        return _home_deployment(home)


_home_lock = threading.Lock()


@functools.lru_cache(maxsize=16)
def _home_deployment(home: str) -> str:
    """Opening the instance costs its storage's start-up (seconds on first use): once per home and process."""
    from dagster import DagsterInstance

    instance = DagsterInstance.get()
    try:
        return derived_deployment(instance)
    finally:
        instance.dispose()


def shared_store(url: str, *, retry_budget: float | None = None, packages: Sequence[str] = ()) -> RecoveryStore:
    """One migrated store per URL per process: ops, watchdogs and sensors share its pool.

    ``packages`` are applications' own migration packages, applied once per process after the library's.
    """
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = RecoveryStore(url) if retry_budget is None else RecoveryStore(url, retry_budget=retry_budget)
            store.migrate()
            _stores[url] = store
        elif retry_budget is not None:
            store.retry_budget = retry_budget
        for package in packages:
            if (url, package) not in _migrated_packages:
                store.migrate(package)
                _migrated_packages.add((url, package))
        return store


# Subclassed bare, as Dagster's own resources are: a ConfigurableResource's value is the resource itself.
class RecoveryResource(ConfigurableResource):  # type: ignore[type-arg]
    """Application tables and recovery settings shared by recoverable ops and the sensors."""

    # A refused setting's error would otherwise show the fields given, the database URL's password among them.
    model_config = ConfigDict(hide_input_in_errors=True, extra="forbid")

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the application tables (postgresql://... or sqlite:///...). "
        "Defaults to $RECOVERY_DATABASE_URL, else SQLite under $DAGSTER_HOME. Pass secrets with EnvVar.",
    )
    deployment: str | None = Field(
        default=None,
        description="The deployment (one Dagster instance) whose sensors own this resource's pipelines: only they "
        "reclaim, resume, stop or give them up. Default: $RECOVERY_DEPLOYMENT, else derived from the Dagster "
        "instance's run storage, so two instances sharing the application tables never both resume one crash.",
    )
    migration_packages: list[str] = Field(
        default_factory=list,
        description="Python packages holding your own application tables' migrations "
        "(<package>/sql/<postgres|sqlite>/NNNN_name.sql), applied after the library's when the store is first "
        "opened and recorded apart from them.",
    )
    heartbeat_interval: float = Field(default=30.0, description="Seconds between watchdog pulses.")
    heartbeat_timeout: float = Field(
        default=90.0, description="Seconds without a pulse before a pipeline is an orphan (ORPHAN_HEARTBEAT_THRESHOLD)."
    )
    stall_timeout: float | None = Field(
        default=None,
        description="Seconds a node may go without progress before it counts as stuck; None disables. It becomes "
                    "due between this and a tenth more after its last progress, never sooner (progress moves the "
                    "deadline only when less than this is left), and the orphan sensor finds it at its next tick.",
    )
    hard_deadline_seconds: float | None = Field(
        default=None,
        description="Hard deadline: the longest a pipeline may run, however alive its heartbeats; None for no limit.",
    )
    max_resumes: int = Field(default=3, description="Resumes before a crashing pipeline is given up.")
    max_age_seconds: float | None = Field(
        default=24 * 3600.0, description="Pipelines older than this are given up instead of resumed."
    )
    launch_grace_seconds: float = Field(
        default=300.0, description="Seconds a reclaimed pipeline waits for its resume run before it re-orphans."
    )
    enable_orphan_recovery: bool = Field(
        default=True,
        description="Reclaim and resume orphaned pipelines (a switch to turn recovery off in an emergency).")
    max_retries: int = Field(default=5, description="In-run retries (RetryRequested) of a node on transient errors.")
    retry_initial_delay: float = Field(default=2.0, description="First retry delay in seconds; doubles each time.")
    retry_max_delay: float = Field(default=120.0, description="Upper bound of one retry delay in seconds.")
    retry_jitter: float = Field(default=0.1, description="Relative jitter of retry delays, 0 to 1 (0 disables).")
    same_error_limit: int = Field(
        default=5, description="Consecutive errors of one category before escalation: a transient category pauses "
        "the pipeline (shown as waiting), a permanent one fails it.")
    database_retry_budget: float | None = Field(
        default=None, description="Seconds a store call keeps retrying a transient database error (a restart, a lost "
        "connection, a deadlock) before the node degrades (optional) or fails retryably. None: the heartbeat timeout.",
    )
    event_retention_seconds: float = Field(
        default=30 * 86400.0, description="Events (rx_events) older than this are deleted by the orphan sensor "
        "(30 days by default; at least one hour).")
    finished_pipeline_retention_seconds: float | None = Field(
        default=None, description="Completed and failed pipelines that ended longer ago than this (canceled ones are "
        "kept) are deleted with their nodes, item checkpoints, completed queue items (a dedupe key stays), call "
        "journal, events, ledger rows and "
        "uncounted transitions, by the orphan sensor at most once an hour, in small batches (see `recovery-ext "
        "prune`). Cost totals and the counts behind the Prometheus counters are kept. None (the default) keeps "
        "them for ever; at least one day, since a re-execution of a failed run reuses its pipeline's checkpoints "
        "only while it is kept.")
    allow_long_durations: bool = Field(
        default=False, description="Allow timeouts and deadlines above one day (refused by default as a likely typo).")
    outage_pause_initial: float = Field(
        default=30.0, description="First pause of a pipeline after same_error_limit transient errors in a row, in "
        "seconds; doubles with each pause, with jitter.")
    outage_pause_max: float = Field(default=300.0, description="Longest single outage pause in seconds.")
    outage_budget_seconds: float = Field(
        default=7200.0, description="A provider outage longer than this gives up with a clear reason (default 2 h).")
    breaker_failure_threshold: int = Field(
        default=5, description="Consecutive transient failures of one endpoint, across all pipelines, that open its "
        "circuit breaker.")
    breaker_cooldown: float = Field(
        default=30.0, description="Seconds an endpoint's breaker stays open before one half-open probe; doubles "
        "each time the probe fails.")
    breaker_max_cooldown: float = Field(
        default=120.0, description="Longest breaker cool-down in seconds; after the provider is back, the next "
        "probe may still be this far away.")
    breaker_probe_timeout: float = Field(
        default=120.0, description="Seconds after which an unanswered half-open probe is handed to another caller.")
    breaker_refresh_seconds: float = Field(
        default=1.0, description="How long a node trusts its last read of a closed, failure-free breaker before "
        "reading it again (0: before every provider call). Another process's opening of the breaker reaches this "
        "node at most this much later; any failure in this node drops the trust at once.")

    spend_cap_tokens: int | None = Field(
        default=None, description="Most tokens one pipeline may spend on provider calls and jobs, across its runs, "
        "resumes and take-overs. Each request and job submission reserves its estimate first; at the cap the "
        "pipeline pauses (waiting, reason 'spend cap') until an operator raises it (`recovery-ext spend-cap set`). "
        "None: no cap.")
    spend_cap_cost: float | None = Field(
        default=None, description="Most money one pipeline may spend, in the currency of the price table the calls "
        "are priced with (a call of an unpriced model counts 0 here, as in the ledger). None: no cap.")
    deployment_spend_cap_tokens: int | None = Field(
        default=None, description="Most tokens all the pipelines of this deployment may spend together, over the "
        "life of the application tables (an operator raises or resets it). None: no cap.")
    deployment_spend_cap_cost: float | None = Field(
        default=None, description="Most money all the pipelines of this deployment may spend together. None: no cap.")
    spend_cap_poll_seconds: float = Field(
        default=30.0, description="How often a pipeline paused at a spend cap looks whether it was raised.")

    @model_validator(mode="after")
    def _validate(self) -> RecoveryResource:
        """Refuse NaN, infinities, out-of-bounds and contradictory settings when the definitions load."""
        self._settings()
        return self

    def _config(self) -> tuple[tuple[str, Any], ...]:
        return tuple((name, tuple(value) if isinstance(value, list) else value)
                     for name, value in self.__dict__.items() if name in type(self).model_fields)

    def _settings(self) -> _Settings:
        config = self._config()
        settings = _checked_configs.get(config)
        if settings is None:
            settings = self._check_settings()
            if len(_checked_configs) < _MAX_CHECKED_CONFIGS:
                _checked_configs[config] = settings
        return settings

    def _check_settings(self) -> _Settings:
        long = self.allow_long_durations
        if self.deployment is not None:
            check_deployment("deployment", self.deployment)
        for package in self.migration_packages:
            check_package(package)
        heartbeat = HeartbeatSettings(interval=self.heartbeat_interval, timeout=self.heartbeat_timeout,
                                      stall_timeout=self.stall_timeout, allow_long=long)
        recovery = RecoverySettings(enabled=self.enable_orphan_recovery,
                                    launch_grace_seconds=self.launch_grace_seconds,
                                    max_age_seconds=self.max_age_seconds, allow_long=long)
        check_seconds("hard_deadline_seconds", self.hard_deadline_seconds, minimum=1.0, allow_none=True,
                      allow_long=long)
        check_seconds("retry_initial_delay", self.retry_initial_delay, minimum=0.0, maximum=3600.0)
        check_seconds("retry_max_delay", self.retry_max_delay, minimum=0.0, maximum=DAY)
        check_seconds("database_retry_budget", self.database_retry_budget, minimum=0.0, allow_none=True,
                      allow_long=long)
        if not isinstance(self.retry_jitter, (int, float)) or not 0.0 <= self.retry_jitter <= 1.0:
            raise ConfigurationError(f"retry_jitter must be between 0 and 1, got {self.retry_jitter!r}")
        check_seconds("event_retention_seconds", self.event_retention_seconds, minimum=3600.0,
                      maximum=10 * 366 * DAY, allow_long=long)
        check_seconds("finished_pipeline_retention_seconds", self.finished_pipeline_retention_seconds, minimum=DAY,
                      maximum=10 * 366 * DAY, allow_none=True, allow_long=long)
        check_count("max_resumes", self.max_resumes, maximum=1000)
        check_count("max_retries", self.max_retries, maximum=1000)
        limits = PipelineLimits(heartbeat_timeout=self.heartbeat_timeout, deadline_seconds=self.hard_deadline_seconds,
                                max_resumes=self.max_resumes)
        check_count("same_error_limit", self.same_error_limit, minimum=1, maximum=1000)
        self.retry_policy()
        for name in ("outage_pause_initial", "outage_pause_max", "outage_budget_seconds", "breaker_cooldown",
                     "breaker_max_cooldown", "breaker_probe_timeout"):
            check_seconds(name, getattr(self, name), minimum=0.01, allow_long=long)
        check_count("breaker_failure_threshold", self.breaker_failure_threshold, minimum=1, maximum=1000)
        check_seconds("breaker_refresh_seconds", self.breaker_refresh_seconds, minimum=0.0, maximum=60.0)
        outage = OutageSettings(
            pause_after=self.same_error_limit, pause_initial=self.outage_pause_initial, pause_max=self.outage_pause_max,
            budget_seconds=self.outage_budget_seconds, jitter=self.retry_jitter,
            breaker_threshold=self.breaker_failure_threshold, breaker_cooldown=self.breaker_cooldown,
            breaker_max_cooldown=self.breaker_max_cooldown, probe_timeout=self.breaker_probe_timeout,
            breaker_refresh=self.breaker_refresh_seconds)
        caps = SpendCaps(pipeline_tokens=self.spend_cap_tokens, pipeline_cost=self.spend_cap_cost,
                         deployment_tokens=self.deployment_spend_cap_tokens,
                         deployment_cost=self.deployment_spend_cap_cost, poll_seconds=self.spend_cap_poll_seconds)
        return _Settings(heartbeat, recovery, limits, outage, caps)

    def enforce_event_retention(self, store: RecoveryStore) -> int:
        """Delete a batch of events past the retention; never raises (the sensor's tick goes on)."""
        try:
            return store.reports.prune_events(self.event_retention_seconds)
        except Exception as exc:  # noqa: BLE001 - retention is housekeeping; it is retried next tick
            log.warning("could not delete old events: %s", redact(exc))
            return 0

    def store_retry_budget(self) -> float:
        return self.heartbeat_timeout if self.database_retry_budget is None else self.database_retry_budget

    def url(self) -> str:
        return self.database_url or default_database_url()

    def deployment_name(self, instance: DagsterInstance | None) -> str:
        """This deployment's name: the field, else ``$RECOVERY_DEPLOYMENT``, else one derived from ``instance``."""
        if self.deployment:
            return self.deployment  # checked when the resource was built
        named = os.environ.get(DEPLOYMENT_ENV)
        return check_deployment(DEPLOYMENT_ENV, named) if named else derived_deployment(instance)

    def get_store(self) -> RecoveryStore:
        return shared_store(self.url(), retry_budget=self.store_retry_budget(), packages=self.migration_packages)

    def heartbeat_settings(self) -> HeartbeatSettings:
        return self._settings().heartbeat

    def pipeline_limits(self) -> PipelineLimits:
        """The limits every pipeline this resource creates is held to: its owner's heartbeat timeout, its hard
        deadline and its resumes."""
        return self._settings().limits

    def recovery_settings(self) -> RecoverySettings:
        return self._settings().recovery

    def outage_settings(self) -> OutageSettings:
        return self._settings().outage

    def spend_caps(self) -> SpendCaps:
        return self._settings().spend_caps

    def retry_wait(self) -> wait_jittered_exponential:
        return wait_jittered_exponential(self.retry_initial_delay, max_delay=self.retry_max_delay,
                                         jitter=self.retry_jitter)

    def retry_policy(self, **overrides: Any) -> RetryPolicy:
        """The same backoff for calls inside a node (e.g. one LLM request)."""
        settings: dict[str, Any] = dict(max_attempts=self.max_retries + 1, initial_delay=self.retry_initial_delay,
                                        max_delay=self.retry_max_delay, jitter=self.retry_jitter,
                                        same_error_limit=self.same_error_limit)
        settings.update(overrides)
        return RetryPolicy(**settings)
