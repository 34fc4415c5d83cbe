"""A series with nothing to count reads 0, not absent: a query like `rate(recovery_reclaims_total[5m])` or an alert
on `recovery_queue_dead_items > 0` needs the series before the first event, and a count that went back to nothing
must read 0, not vanish."""

from __future__ import annotations

from prometheus_client import generate_latest

from recovery_ext._observe.exporter import RECLAIM_CAUSES, RESUME_CAUSES, registry_for


def scrape(store) -> str:
    return generate_latest(registry_for(store)).decode()


def test_every_known_series_reads_0_before_anything_happened(store):
    store.pipelines.create_pipeline("etl", ["n"], owner="run-1")
    store.queue.enqueue("scans", [{"name": "a.pdf"}])
    body = scrape(store)
    for cause in RECLAIM_CAUSES:
        assert f'recovery_reclaims_total{{cause="{cause}"}} 0.0' in body
    for cause in RESUME_CAUSES:
        assert f'recovery_resume_runs_total{{cause="{cause}"}} 0.0' in body
    assert 'recovery_pipelines{dagster_job="etl",deployment="' in body
    for status in ("pending", "completed", "failed", "canceled"):
        assert f'dagster_job="etl",deployment="{_deployment(body)}",status="{status}"}} 0.0' in body
    for on in ("provider outage", "rate budget", "spend cap", "provider job"):  # every kind of wait reads 0
        assert f'recovery_pipelines_waiting{{dagster_job="etl",waiting_on="{on}"}} 0.0' in body
    assert 'recovery_pipelines_heartbeat_expired{dagster_job="etl"} 0.0' in body
    for status in ("completed", "degraded"):
        assert f'recovery_items{{dagster_job="etl",status="{status}"}} 0.0' in body
    for status in ("processing", "completed", "failed", "dead"):
        assert f'recovery_queue_items{{queue="scans",status="{status}"}} 0.0' in body
    for fate in ("saved", "wasted"):
        assert f'recovery_provider_{fate}_calls_total{{dagster_job="etl"}} 0.0' in body


def _deployment(body: str) -> str:
    return body.split('recovery_pipelines{dagster_job="etl",deployment="', 1)[1].split('"', 1)[0]
