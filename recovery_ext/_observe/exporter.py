"""The Prometheus exporter: a collector that reads the application tables at every scrape.

It keeps no state of its own (no counters in memory): every sample is recomputed from the
tables, so several exporters over one database agree, and restarting one loses nothing.
Counters are counts of recorded history (``rx_transitions``), which only grows.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from recovery_ext._classify.redaction import redact
from recovery_ext._errors import RecoveryError
from recovery_ext._store.models import MetricsSnapshot
from recovery_ext._store.observability import PIPELINE_LABELS, RECLAIM_CAUSES, RESUME_CAUSES
from recovery_ext._store.schema import BREAKER_STATES
from recovery_ext._store.statuses import ItemStatus, PipelineStatus, QueueStatus
from recovery_ext._store.models import WaitKind
from recovery_ext._store.interfaces import CliStore
from recovery_ext._store.store import RecoveryStore

log = logging.getLogger("recovery_ext.metrics")


@dataclass(frozen=True)
class MetricSpec:
    name: str          # without the _total suffix a counter gets on exposition
    kind: str          # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()

    def family(self, labels: tuple[str, ...] | None = None) -> CounterMetricFamily | GaugeMetricFamily:
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        return cls(self.name, self.help, labels=list(labels if labels is not None else self.labels))


# Every metric the exporter shows; the README's "Metrics" section documents each (a test checks).
DATABASE_UP = MetricSpec("recovery_database_up", "gauge",
                         "1 if the last scrape read the application tables, 0 if the database could not be read")
SCRAPE_SECONDS = MetricSpec("recovery_scrape_duration_seconds", "gauge",
                            "Seconds the last scrape spent reading the application tables")
PIPELINES = MetricSpec("recovery_pipelines", "gauge", "Pipelines by deployment, Dagster job and status (rx_pipelines)",
                       tuple(PIPELINE_LABELS))
WAITING = MetricSpec("recovery_pipelines_waiting", "gauge",
                     "Running pipelines shown as waiting, by what they wait on (a provider outage, a rate budget, "
                     "a spend cap, a provider job)", ("dagster_job", "waiting_on"))
EXPIRED = MetricSpec("recovery_pipelines_heartbeat_expired", "gauge",
                     "Running pipelines whose heartbeat deadline passed: orphans not reclaimed yet", ("dagster_job",))
OLDEST_HEARTBEAT = MetricSpec("recovery_oldest_heartbeat_age_seconds", "gauge",
                              "Seconds since the oldest heartbeat among running pipelines (0 when none runs)")
RECLAIMS = MetricSpec("recovery_reclaims", "counter", "Orphaned pipelines reclaimed, by cause", ("cause",))
RESUME_RUNS = MetricSpec("recovery_resume_runs", "counter",
                         "Runs handed a pipeline with a new epoch, by cause (a reclaim's cause, re_execution, "
                         "redo_degraded)", ("cause",))
GIVEN_UP = MetricSpec("recovery_pipelines_given_up", "counter",
                      "Pipelines the recovery scan gave up on (resumes or age exhausted)")
ITEMS = MetricSpec("recovery_items", "gauge", "Item checkpoints by Dagster job and status", ("dagster_job", "status"))
QUEUE_ITEMS = MetricSpec("recovery_queue_items", "gauge", "Work queue items by queue and status", ("queue", "status"))
QUEUE_DEPTH = MetricSpec("recovery_queue_depth", "gauge", "Work queue items ready to be claimed", ("queue",))
QUEUE_DEAD = MetricSpec("recovery_queue_dead_items", "gauge",
                        "Work queue items dead after their last attempt", ("queue",))
BREAKER_STATE = MetricSpec("recovery_circuit_breaker_state", "gauge",
                           "1 for the state each endpoint's circuit breaker is in, 0 for the others",
                           ("endpoint", "state"))
BREAKER_FAILURES = MetricSpec("recovery_circuit_breaker_consecutive_failures", "gauge",
                              "Transient failures in a row at each endpoint", ("endpoint",))

# The ledger of provider calls: what was spent, what a resume saved (calls it skipped or replayed, ledger.py),
# what was wasted (answers paid for that never reached a checkpoint). Cost is in the price table's currency.
PROVIDER_CALLS = MetricSpec("recovery_provider_calls", "counter", "Provider calls recorded in the ledger",
                            ("dagster_job", "model", "outcome"))
PROVIDER_TOKENS = MetricSpec("recovery_provider_tokens", "counter", "Tokens of provider calls, by type (input, output)",
                             ("dagster_job", "model", "type"))
PROVIDER_COST = MetricSpec("recovery_provider_cost", "counter",
                           "Cost of provider calls with a price, in the price table's currency",
                           ("dagster_job", "model"))
FATES = {fate: {what: MetricSpec(f"recovery_provider_{fate}_{what}", "counter", f"{help_} {text}", ("dagster_job",))
                for what, text in (("calls", "(calls)"), ("tokens", "(tokens, input and output)"),
                                   ("cost", "(cost, in the price table's currency)"))}
         for fate, help_ in (("saved", "Provider work a resume skipped or replayed in a node it went through again"),
                             ("wasted", "Provider work paid for whose answer never reached a checkpoint"))}
LEDGER_SKIPPED = MetricSpec("recovery_ledger_rows_skipped", "gauge",
                            "Corrupt ledger rows (e.g. an infinite token count) left out of the provider metrics")

# Spend caps (per deployment, and per running pipeline): each cap and what is left of it (spent and reserved
# taken off). A cap of one kind only (tokens or money) shows only that kind.
SPEND_CAPS = {(kind, what): MetricSpec(f"recovery_spend_cap_{kind}{suffix}", "gauge", f"{help_} ({unit})", ("scope",))
              for kind, unit in (("tokens", "tokens"), ("cost", "in the price table's currency"))
              for what, suffix, help_ in (("cap", "", "A spend cap"),
                                          ("left", "_left", "What a spend cap leaves: the cap less spent and "
                                                            "reserved"))}

METRICS: tuple[MetricSpec, ...] = (DATABASE_UP, SCRAPE_SECONDS, PIPELINES, WAITING, EXPIRED, OLDEST_HEARTBEAT,
                                   RECLAIMS, RESUME_RUNS, GIVEN_UP, ITEMS, QUEUE_ITEMS, QUEUE_DEPTH, QUEUE_DEAD,
                                   BREAKER_STATE, BREAKER_FAILURES, PROVIDER_CALLS, PROVIDER_TOKENS, PROVIDER_COST,
                                   LEDGER_SKIPPED,
                                   *(spec for fate in FATES.values() for spec in fate.values()),
                                   *SPEND_CAPS.values())


# Seconds a scrape may spend on any statement or lock wait: with the CLI's 5 s connect timeout, a scrape of a
# locked or unreachable database answers `up 0` before Prometheus's default 10 s scrape timeout.
SCRAPE_TIMEOUT = 4.0


class RecoveryCollector(Collector):
    """Reads ``store`` at each ``collect()`` (each scrape); a database it cannot read within ``timeout``
    seconds gives ``up 0`` and no other sample: nothing read earlier is shown as if it were read now."""

    def __init__(self, store: CliStore, *, timeout: float = SCRAPE_TIMEOUT) -> None:
        self.timeout = timeout
        # Its own engine whose connect, statement and lock (SQLite busy) timeouts are the scrape's: opening a
        # connection waits for a lock too (SQLite's connect hook reads the journal mode), before any statement.
        self.store = store if store.dialect.statement_timeout <= timeout else RecoveryStore(
            store.url.render_as_string(hide_password=False), retry_budget=0, statement_timeout=timeout,
            connect_timeout=min(store.dialect.connect_timeout, timeout))

    def describe(self) -> Iterator[Metric]:
        # Registering must not query the database: the names and types, without samples.
        for spec in METRICS:
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            # once: a retry would outlast the scrape
            snapshot = self.store.reports.scrape_snapshot(timeout=self.timeout)
        except RecoveryError as exc:
            log.warning("metrics scrape could not read the database: %s", redact(exc))
            snapshot = None
        up = DATABASE_UP.family()
        up.add_metric([], 0.0 if snapshot is None else 1.0)
        yield up
        took = SCRAPE_SECONDS.family()
        took.add_metric([], time.perf_counter() - started)
        yield took
        if snapshot is not None:
            yield from snapshot_families(snapshot)


def snapshot_families(s: MetricsSnapshot) -> Iterator[Metric]:
    """The samples of one snapshot, one family per metric.

    A series with nothing to count reads 0 rather than being absent: every reclaim and resume cause, every
    status of each known (deployment, job) and queue, and each known job's waiting, expired, item and
    saved/wasted series (a rate or an alert needs the series before the first event)."""
    pipelines = PIPELINES.family(s.pipeline_labels)
    status_at = s.pipeline_labels.index("status")
    pipeline_counts = {tuple(_text(v) for v in values): n for values, n in s.pipelines}
    for key in {k[:status_at] + k[status_at + 1:] for k in pipeline_counts}:
        for pipeline_status in PipelineStatus:
            pipeline_counts.setdefault(key[:status_at] + (pipeline_status.value,) + key[status_at:], 0)
    for values, n in sorted(pipeline_counts.items()):
        pipelines.add_metric(list(values), n)
    yield pipelines
    job_at = s.pipeline_labels.index("dagster_job")
    jobs = sorted({_text(values[job_at]) for values, _ in s.pipelines})
    waiting = WAITING.family()
    waiting_counts = {(_text(job), str(on)): count for job, on, count in s.waiting_pipelines}
    for job in jobs:  # every known job and kind of wait reads 0 rather than being absent
        for wait_kind in WaitKind:
            waiting_counts.setdefault((job, wait_kind.value), 0)
    for (job, on), count in sorted(waiting_counts.items()):
        waiting.add_metric([job, on], count)
    yield waiting
    yield _by_one(EXPIRED, s.expired_pipelines, jobs)
    oldest = OLDEST_HEARTBEAT.family()
    oldest.add_metric([], s.oldest_heartbeat_age_seconds or 0.0)
    yield oldest
    yield _by_one(RECLAIMS, s.reclaims, RECLAIM_CAUSES)
    yield _by_one(RESUME_RUNS, s.resume_runs, RESUME_CAUSES)
    given_up = GIVEN_UP.family()
    given_up.add_metric([], s.given_up)
    yield given_up
    items = ITEMS.family()
    item_counts = {(_text(job), _text(status)): n for job, status, n in s.items}
    for job in jobs:
        for item_status in ItemStatus:
            item_counts.setdefault((job, item_status.value), 0)
    for (job, status), n in sorted(item_counts.items()):
        items.add_metric([job, status], n)
    yield items
    queued, depth, dead = QUEUE_ITEMS.family(), QUEUE_DEPTH.family(), QUEUE_DEAD.family()
    queues = sorted({q for q, _, _ in s.queue_items})
    counts = {(q, status): n for q, status, n in s.queue_items}
    for queue in queues:
        for queue_status in QueueStatus:
            counts.setdefault((queue, queue_status.value), 0)
    for (queue, status), n in sorted(counts.items(), key=lambda kv: (_text(kv[0][0]), _text(kv[0][1]))):
        queued.add_metric([_text(queue), _text(status)], n)
    for queue in queues:  # every known queue shows its depth and dead items, 0 included
        depth.add_metric([_text(queue)], counts.get((queue, QueueStatus.READY), 0))
        dead.add_metric([_text(queue)], counts.get((queue, QueueStatus.DEAD), 0))
    yield queued
    yield depth
    yield dead
    state, failures = BREAKER_STATE.family(), BREAKER_FAILURES.family()
    for b in s.breakers:
        endpoint = redact(b["endpoint"])
        for name in BREAKER_STATES:
            state.add_metric([endpoint, name], 1.0 if b["state"] == name else 0.0)
        failures.add_metric([endpoint], b["consecutive_failures"])
    yield state
    yield failures
    yield from _provider_families(s, jobs)
    yield from _spend_cap_families(s)


def _spend_cap_families(s: MetricsSnapshot) -> Iterator[Metric]:
    for (kind, what), spec in SPEND_CAPS.items():
        family = spec.family()
        for cap in s.spend_caps:
            value = getattr(cap, f"max_{kind}" if what == "cap" else f"left_{kind}")
            if value is not None:
                family.add_metric([_text(cap.scope)], float(value))
        yield family


def _provider_families(s: MetricsSnapshot, jobs: list[str]) -> Iterator[Metric]:
    calls, tokens, cost = PROVIDER_CALLS.family(), PROVIDER_TOKENS.family(), PROVIDER_COST.family()
    spent_cost: dict[tuple[str, str], float] = {}
    for job, model, outcome, n, _, _, money in s.provider_calls:
        job, model = _text(job), _text(model)
        calls.add_metric([job, model, _text(outcome)], n)
        spent_cost[(job, model)] = spent_cost.get((job, model), 0.0) + float(money)
    spent_tokens: dict[tuple[str, str, str], int] = {}
    for job, model, _, _, tokens_in, tokens_out, _ in s.provider_calls:
        for kind, value in (("input", tokens_in), ("output", tokens_out)):
            key = (_text(job), _text(model), kind)
            spent_tokens[key] = spent_tokens.get(key, 0) + int(value)
    for key, value in sorted(spent_tokens.items()):
        tokens.add_metric(list(key), value)
    for job_model, money in sorted(spent_cost.items()):
        cost.add_metric(list(job_model), money)
    yield calls
    yield tokens
    yield cost
    skipped = LEDGER_SKIPPED.family()
    skipped.add_metric([], s.skipped_ledger_rows)
    yield skipped
    costs = {_text(job): figures for job, figures in s.provider_costs.items()}
    for fate, specs in FATES.items():
        for what, spec in specs.items():
            family = spec.family()
            for job in sorted(set(costs) | set(jobs)):
                family.add_metric([job], float(costs[job][f"{fate}_{what}"]) if job in costs else 0.0)
            yield family


def _by_one(spec: MetricSpec, rows: Iterable[tuple[Any, float]], known: Iterable[str] = ()) -> Metric:
    """One sample per label value: each of ``rows``, and 0 for each ``known`` value with no row."""
    family = spec.family()
    counts = {_text(label): n for label, n in rows}
    for label in known:
        counts.setdefault(label, 0)
    for label, n in sorted(counts.items()):
        family.add_metric([label], n)
    return family


def _text(value: object) -> str:
    return "" if value is None else str(value)


def registry_for(store: CliStore) -> CollectorRegistry:
    """A registry holding only the recovery collector (no process or platform metrics of the exporter)."""
    return _registry(RecoveryCollector(store))


def _registry(collector: RecoveryCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    return registry


class MetricsServer:
    """The exporter's HTTP server on ``host:port`` (``port`` 0: any free port), in a background thread.

    It listens before it touches the database: an exporter started while the database is down, locked or
    silent serves ``recovery_database_up 0`` and reports it up once it answers."""

    def __init__(self, store: CliStore, host: str, port: int) -> None:
        self.collector = RecoveryCollector(store)
        self.server, self._thread = start_http_server(port, addr=host, registry=_registry(self.collector))
        self.host, self.port = host, self.server.server_port

    def check_database(self) -> None:
        """Read the schema's version and the tables once, within a scrape's timeouts: MigrationError for a
        newer release's tables, another RecoveryError for a database that cannot be read now."""
        store = self.collector.store
        store.check_schema()
        store.reports.scrape_snapshot(timeout=self.collector.timeout)

    def serve_until_stopped(self, first: Callable[[], None] = lambda: None) -> None:
        """Run ``first`` and block until SIGINT or SIGTERM, then stop serving (``first`` raising stops it too).

        A signal that arrives while ``first`` runs stops the server once it returns."""
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            first()
            stop.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
