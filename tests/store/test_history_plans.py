"""Every periodic and per-pipeline read has an index or an aggregate that matches it (EXPLAIN on PostgreSQL).

A history of finished pipelines is seeded as the history bench seeds it; each statement the scrape, the
orphan and stuck-item ticks, `status`, `costs` and the report run is planned again with sequential scans
disabled, so a plan that still scans a history table has no index it could use instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import event

from recovery_ext._observe.exporter import RecoveryCollector
from recovery_ext._store.models import PassPlan, Scope
from recovery_ext._store.store import RecoveryStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the bench package, for its history seed
from bench import history_bench  # noqa: E402
import store_rows

HISTORY_TABLES = ("rx_pipelines", "rx_nodes", "rx_node_items", "rx_provider_calls", "rx_transitions", "rx_events",
                  "rx_queue_items")
AGGREGATES = ("rx_pipeline_counts", "rx_queue_counts", "rx_resume_counts", "rx_finished_items", "rx_ledger_daily")
FINISHED = 2000


@pytest.fixture
def history(pg_url) -> RecoveryStore:
    store = RecoveryStore(pg_url)
    store.migrate()
    seeds = history_bench.sections("postgresql")
    history_bench.seed(store, seeds["live"])
    first, last = history_bench.FIRST_FINISHED, history_bench.FIRST_FINISHED + FINISHED - 1
    history_bench.seed(store, seeds["history"], lo=first, hi=last)
    store_rows.roll_up_finished(store, first, last)
    history_bench.maintain(store, seeds["maintain"])
    yield store
    store.close()


def plans(store: RecoveryStore, work) -> list[tuple[str, str]]:
    """(statement, plan with sequential scans disabled) of each SELECT ``work`` runs through SQLAlchemy."""
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        work()
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    assert seen, "nothing was read"
    planned = []
    with psycopg.connect(store.url.set(drivername="postgresql").render_as_string(hide_password=False)) as conn:
        conn.execute("SET enable_seqscan = off")
        for statement, params in seen:
            rows = conn.execute("EXPLAIN " + statement, params).fetchall()
            planned.append((statement, "\n".join(r[0] for r in rows)))
    return planned


def scans_of_history(planned: list[tuple[str, str]]) -> list[str]:
    return [f"{' '.join(statement.split())[:300]}\n{plan}" for statement, plan in planned
            if any(f"Seq Scan on {table} " in plan + " " for table in HISTORY_TABLES)]


def test_the_scrape_reads_the_aggregates_and_the_live_pipelines_through_indexes(history):
    collector = RecoveryCollector(history)
    planned = plans(collector.store, lambda: list(collector.collect()))
    assert scans_of_history(planned) == []
    read = "\n".join(plan for _, plan in planned)
    for table in AGGREGATES:
        assert f" on {table}" in read, f"the scrape does not read {table}"
    assert "rx_pipelines_live" in read  # live pipelines' items and ledger rows, found through the partial index
    assert "rx_provider_calls_unowned" in read  # ledger rows outside any pipeline


def test_ticks_costs_and_the_report_of_one_pipeline_use_indexes(history):
    scope = Scope(job_names=history_bench.JOBS, deployment="default")
    finished = history_bench.FIRST_FINISHED + 10

    def work():
        history.recovery.tick_snapshot(scope, grace_seconds=300)
        history.recovery.recovery_pass(PassPlan(limit=0, trigger="plans"), scope)
        history.queue.reset_stale(queue="ocr", older_than_seconds=600, reason="plans")
        history.queue.count_ready("ocr")
        history.reports.provider_costs(finished)
        history.reports.pipeline_history(finished)

    planned = plans(history, work)
    assert scans_of_history(planned) == []
    read = "\n".join(plan for _, plan in planned)
    assert "rx_queue_holder_completed" in read  # the report's queue items of one pipeline


def test_status_reads_use_indexes_or_the_counts(history):
    def work():
        history.reports.pipeline_summary()
        history.reports.queue_summary()
        history.recovery.find_orphans()
        history.queue.stale_items(older_than_seconds=600)
        history.queue.waiting_items()
        history.reports.count_events("pipeline_recovered", within_seconds=86400)
        history.reports.dead_items()
        history.providers.waiting_pipelines()
        history.reports.unwatched_pipelines()
        history.recovery.stranded_pipelines()
        history.reports.items_with_unknown_status()
        history.reports.items_with_bad_values()
        history.reports.dangling_rows()

    planned = plans(history, work)
    assert scans_of_history(planned) == []
    read = "\n".join(plan for _, plan in planned)
    for index in ("rx_queue_unknown_status", "rx_queue_unfinished"):
        assert index in read
    assert " on rx_pipeline_counts" in read and " on rx_queue_counts" in read

