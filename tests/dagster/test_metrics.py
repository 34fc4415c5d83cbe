"""The Prometheus exporter: what each metric counts (both databases), no state, clear failures, the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers import expire
from observe_scenario import crash_and_resume, stand_in

from recovery_ext._observe.exporter import METRICS, registry_for
from recovery_ext import scan
from recovery_ext._store.models import PipelineLimits
from recovery_ext._store.models import SpendCaps
from recovery_ext._store.store import RecoveryStore
from recovery_ext._store.models import WaitKind

ROOT = Path(__file__).resolve().parents[2]


def scrape(store) -> dict[tuple[str, tuple], float]:
    """One scrape of a fresh registry over ``store``: {(sample name, sorted labels): value}."""
    text = generate_latest(registry_for(store)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_metric_counts_what_the_tables_hold(store):
    crash = crash_and_resume(store, items_before=3, items_after=2)
    # A running pipeline paused by an outage, and one whose heartbeat expired (an orphan not reclaimed yet).
    waiting = store.pipelines.create_pipeline("ocr", ["a"], owner="w", origin_run_id="w", deployment="eu")
    store.providers.set_waiting(waiting, 60, "429 Too Many Requests")
    orphan = store.pipelines.create_pipeline("ocr", ["a"], owner="o", origin_run_id="o")
    expire(store, orphan.pipeline_id, ago=50)
    expire(store, orphan.pipeline_id, column="heartbeat_at", ago=50)
    # A pipeline with no resumes left is given up by the scan; the orphan above is reclaimed by it.
    hopeless = store.pipelines.create_pipeline("ocr", ["a"], owner="h", origin_run_id="h",
                                    limits=PipelineLimits(max_resumes=0))
    expire(store, hopeless.pipeline_id)
    before_scan = scrape(store)
    stats = scan(store)
    assert (stats.reclaimed, stats.given_up) == (1, 1)
    # A re-execution takes the failed pipeline over.
    store.pipelines.take_over(hopeless.pipeline_id, "h-again")
    store.queue.enqueue("pages", [{"p": 1}, {"p": 2}, {"p": 3}], max_attempts=1)
    [item] = store.queue.claim("pages", "worker-1")
    assert store.queue.fail_item(item, "boom") == "dead"
    endpoint = "https://user:hunter2@llm.example/v1"
    opened = store.providers.breaker_record_failure(endpoint, "x", threshold=1, cooldown=lambda n: 60, error="503")
    assert opened == "opened"

    # A pipeline waiting on a provider job (apart from outages), and the spend caps of the waiting pipeline
    batch = store.pipelines.create_pipeline("ocr", ["a"], owner="b", origin_run_id="b", deployment="eu")
    store.providers.show_wait(batch, 30, "openai-batch job b-1 (3 items)", kind=WaitKind.PROVIDER_JOB)
    scopes = store.providers.spend_configure(waiting, SpendCaps(pipeline_tokens=1000, deployment_cost=2.0))
    assert store.providers.spend_reserve(waiting, scopes, tokens=300, cost=0.5).granted

    m = scrape(store)
    assert m[("recovery_database_up", ())] == 1
    assert m[("recovery_pipelines_waiting", (("dagster_job", "ocr"), ("waiting_on", "provider job")))] == 1
    mine = (("scope", f"pipeline:{waiting.pipeline_id}"),)
    assert (m[("recovery_spend_cap_tokens", mine)], m[("recovery_spend_cap_tokens_left", mine)]) == (1000, 700)
    assert (m[("recovery_spend_cap_cost", (("scope", "deployment:eu"),))],
            m[("recovery_spend_cap_cost_left", (("scope", "deployment:eu"),))]) == (2.0, 1.5)
    assert ("recovery_spend_cap_cost", mine) not in m  # no cap in money on the pipeline
    assert before_scan[("recovery_pipelines_heartbeat_expired", (("dagster_job", "ocr"),))] == 2
    assert before_scan[("recovery_oldest_heartbeat_age_seconds", ())] >= 50
    done = ("recovery_pipelines", (("dagster_job", "ontology"), ("deployment", "default"), ("status", "completed")))
    assert m[done] == 1
    running = ("recovery_pipelines", (("dagster_job", "ocr"), ("deployment", "default"), ("status", "running")))
    assert m[running] == 2
    assert m[("recovery_pipelines", (("dagster_job", "ocr"), ("deployment", "eu"), ("status", "running")))] == 2
    assert m[("recovery_pipelines_waiting", (("dagster_job", "ocr"), ("waiting_on", "provider outage")))] == 1
    assert m[("recovery_pipelines_waiting", (("dagster_job", "ocr"), ("waiting_on", "spend cap")))] == 0  # not absent
    assert m[("recovery_pipelines_heartbeat_expired", (("dagster_job", "ocr"),))] == 0  # reclaimed: 0, not absent
    assert m[("recovery_reclaims_total", (("cause", "heartbeat"),))] == 2
    assert m[("recovery_resume_runs_total", (("cause", "heartbeat"),))] == 2
    assert m[("recovery_resume_runs_total", (("cause", "re_execution"),))] == 1
    assert m[("recovery_pipelines_given_up_total", ())] == 1
    assert m[("recovery_items", (("dagster_job", "ontology"), ("status", "completed")))] == \
        crash.items_before + crash.items_after
    assert m[("recovery_queue_items", (("queue", "pages"), ("status", "ready")))] == 2
    assert m[("recovery_queue_items", (("queue", "pages"), ("status", "dead")))] == 1
    assert m[("recovery_queue_depth", (("queue", "pages"),))] == 2
    assert m[("recovery_queue_dead_items", (("queue", "pages"),))] == 1
    shown = "https://user:***@llm.example/v1"
    assert m[("recovery_circuit_breaker_state", (("endpoint", shown), ("state", "open")))] == 1
    assert m[("recovery_circuit_breaker_state", (("endpoint", shown), ("state", "closed")))] == 0
    assert m[("recovery_circuit_breaker_consecutive_failures", (("endpoint", shown),))] == 1
    assert not any("hunter2" in str(key) for key in m)


def test_exporters_keep_no_state_and_agree(db_url):
    """Two exporters over one database, started at different times, show the same counters."""
    first, second = RecoveryStore(db_url), RecoveryStore(db_url)
    first.migrate()
    try:
        early = scrape(first)
        crash_and_resume(first)
        later = scrape(second)
        assert early[("recovery_reclaims_total", (("cause", "heartbeat"),))] == 0  # 0 before the first reclaim
        assert later[("recovery_reclaims_total", (("cause", "heartbeat"),))] == 1
        again = scrape(first)
        assert {k: v for k, v in again.items() if "scrape_duration" not in k[0]} == \
            {k: v for k, v in later.items() if "scrape_duration" not in k[0]}
    finally:
        first.close()
        second.close()


def test_an_unreachable_database_is_up_zero_not_an_error(pg_admin):
    store = RecoveryStore("postgresql://postgres:secret@127.0.0.1:1/nothing", retry_budget=0, connect_timeout=2)
    m = scrape(store)
    assert m == {("recovery_database_up", ()): 0, ("recovery_scrape_duration_seconds", ()): pytest.approx(
        m[("recovery_scrape_duration_seconds", ())])}


def test_the_docs_document_every_metric():
    page = (ROOT / "docs" / "how-to" / "metrics.md").read_text(encoding="utf-8")
    section = page.split("\n## ", 1)[0]  # the exporter's part, before OpenTelemetry
    names = [s.name + ("_total" if s.kind == "counter" else "") for s in METRICS]
    assert [n for n in names if f"`{n}`" not in section] == []
    for spec in METRICS:  # Prometheus naming: units in the name, counters end in _total on exposition
        assert re.fullmatch(r"recovery_[a-z_]+", spec.name) and not spec.name.endswith("_total")


def test_provider_calls_tokens_and_cost_spent_saved_and_wasted(store):
    with stand_in() as provider:
        crash = crash_and_resume(store, items_before=3, items_after=2, provider=provider)
    m = scrape(store)
    job = (("dagster_job", "ontology"),)
    model = (("dagster_job", "ontology"), ("model", "stand-in-1"))
    assert m[("recovery_provider_calls_total", model + (("outcome", "ok"),))] == provider.calls == 6
    assert m[("recovery_provider_tokens_total", model + (("type", "input"),))] == provider.tokens_in
    assert m[("recovery_provider_tokens_total", model + (("type", "output"),))] == provider.tokens_out
    every = crash.saved + crash.wasted + crash.resumed
    assert m[("recovery_provider_cost_total", model)] == pytest.approx(sum(c.cost for c in every))
    assert m[("recovery_provider_saved_calls_total", job)] == len(crash.saved) == 3
    assert m[("recovery_provider_saved_tokens_total", job)] == sum(c.tokens_in + c.tokens_out for c in crash.saved)
    assert m[("recovery_provider_saved_cost_total", job)] == pytest.approx(sum(c.cost for c in crash.saved))
    assert m[("recovery_provider_wasted_calls_total", job)] == 1
    assert m[("recovery_provider_wasted_tokens_total", job)] == sum(c.tokens_in + c.tokens_out for c in crash.wasted)
    assert m[("recovery_provider_wasted_cost_total", job)] == pytest.approx(crash.wasted[0].cost)
