"""Provider outages end to end, against a real OpenAI-compatible server on 127.0.0.1 (issue 10, item 7).

* an outage compressed by settings: the ontology pipeline is visibly ``waiting``, then ``completed``;
* five pipelines against one failing endpoint: the shared breaker opens, the provider sees no calls
  while it is open, one probe per half-open period, and it closes after recovery;
* degraded items (fallback answers) are redone by ``recovery-ext redo-degraded`` through a resume run
  that the orphan sensor launches.
"""

from __future__ import annotations

import json
import threading
import time

from click.testing import CliRunner
from dagster import DagsterInstance, build_sensor_context, in_process_executor
from sqlalchemy import select
from werkzeug import Response

from recovery_ext._cli import main
from recovery_ext import (
    NodeContext,
    RecoveryResource,
    execute_in_process,
    make_orphan_sensor,
    recoverable_job,
    recoverable_op,
)
from recovery_pipelines.ontology_schema import MIGRATIONS, ont_entities
from recovery_pipelines.llm import LLMResource, heuristic_answer
from recovery_pipelines.ontology import SourceDatabase, make_ontology_job
from recovery_pipelines.sample_data import create_sample_database
import store_rows


class Provider:
    """An OpenAI-compatible chat-completions server whose health the test switches; it logs every call."""

    def __init__(self, *, down: bool = False, refuse_tables: frozenset[str] = frozenset()):
        self.down = down
        self.refuse_tables = refuse_tables
        self.calls: list[tuple[float, str, str]] = []  # (time, task, table)
        self.lock = threading.Lock()

    def __call__(self, request):
        prompt = json.loads(json.loads(request.data)["messages"][-1]["content"])
        table = str(prompt["input"].get("table", ""))
        with self.lock:
            self.calls.append((time.time(), prompt["task"], table))
            down = self.down
        if down:
            return Response('{"error": {"message": "overloaded"}}', status=503, content_type="application/json")
        if prompt["task"] == "describe_entity" and table in self.refuse_tables:
            return Response('{"error": {"message": "content policy"}}', status=400, content_type="application/json")
        content = json.dumps(heuristic_answer(prompt["task"], prompt["input"]) | (
            {"name": f"LLM {table}"} if prompt["task"] == "describe_entity" else {}))
        return Response(json.dumps({
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        }), content_type="application/json")


def serve(httpserver, provider) -> LLMResource:
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(provider)
    return LLMResource(base_url=httpserver.url_for("/v1"), model="m", api_key="sk-test", timeout=5,
                       initial_delay=0.05, max_delay=0.2)


def recovery(url, **kw) -> RecoveryResource:
    # one deployment for the in-process runs and the sensor, which each get their own ephemeral instance
    settings = dict(database_url=url, migration_packages=[MIGRATIONS], deployment="tests", heartbeat_interval=0.5,
                    heartbeat_timeout=10, max_retries=2,
                    retry_initial_delay=0.01, retry_max_delay=0.02, same_error_limit=3,
                    outage_pause_initial=0.5, outage_pause_max=1.0, breaker_failure_threshold=3,
                    breaker_cooldown=1.0, breaker_max_cooldown=1.5, breaker_probe_timeout=10)
    return RecoveryResource(**{**settings, **kw})


def cli(url, *args):
    result = CliRunner().invoke(main, ["--database-url", url, *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_compressed_outage_shows_the_pipeline_waiting_then_it_completes(store, db_url, httpserver, tmp_path,
                                                                          cpu_hog):
    shop = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    create_sample_database(shop)
    provider = Provider(down=True)
    llm = serve(httpserver, provider)
    ontology = make_ontology_job(executor_def=in_process_executor)
    results = []
    runner = threading.Thread(target=lambda: results.append(execute_in_process(
        ontology, resources={"recovery": recovery(db_url), "llm": llm, "source": SourceDatabase(url=shop)},
        raise_on_error=False)))
    runner.start()
    seen_waiting, shown, status = None, None, None
    deadline = time.monotonic() + 120
    while (shown is None or status is None) and time.monotonic() < deadline:
        pipelines = store.reports.list_pipelines()
        if pipelines:  # pauses come and go while the outage lasts: look until each view caught one
            seen_waiting = pipelines[0].id
            view = json.loads(cli(db_url, "--json", "pipelines", "show", str(seen_waiting)))
            if view["pipeline"]["shown_status"] == "waiting":
                shown = view
            text = cli(db_url, "status")
            if f"pipeline {seen_waiting} (ontology_extraction) waiting, next try" in text:
                status = text
        time.sleep(0.05)
    assert shown is not None and status is not None, "the pipeline never showed as waiting during the outage"
    assert shown["pipeline"]["waiting_reason"] and shown["pipeline"]["waiting_until"]
    def pauses():
        return sum(e["kind"] == "pipeline_waiting" for e in store.reports.recent_events(limit=10_000))

    more = pauses() + 3  # the outage goes on: the pipeline pauses again and again, it does not fail
    while pauses() < more and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pauses() >= more and store.pipelines.get_pipeline(seen_waiting).status == "running"
    with provider.lock:
        provider.down = False
    runner.join(180)
    (result,) = results
    assert result.success
    p = store.pipelines.get_pipeline(seen_waiting)
    assert p.status == "completed" and p.waiting_until is None
    assert store.providers.degraded_counts(p.id) == {}  # every entity was named by the LLM, none by a fallback
    kinds = [e["kind"] for e in store.reports.recent_events(limit=10_000)]
    assert "pipeline_waiting" in kinds and "breaker_opened" in kinds and "breaker_closed" in kinds
    assert "pipeline_failed" not in kinds


@recoverable_op(required_resource_keys={"llm"})
def ask(ctx: NodeContext) -> dict:
    llm = ctx.context.resources.llm.enricher(ctx)
    for item in ctx.items(["a", "b", "c"]):
        item.complete(llm.complete_json("describe_entity", {"table": item.key, "columns": []}))
    return ctx.completed_items()


@recoverable_job(executor_def=in_process_executor)
def asking():
    ask()


def test_five_pipelines_share_one_breaker_that_keeps_calls_away_while_open(store, db_url, httpserver, cpu_hog):
    provider = Provider(down=True)
    llm = serve(httpserver, provider)
    results = []

    def run_one():
        results.append(execute_in_process(asking, resources={"recovery": recovery(db_url), "llm": llm},
                                          raise_on_error=False))

    threads = [threading.Thread(target=run_one) for _ in range(5)]
    for t in threads:
        t.start()

    def events(kind):
        return [e for e in store.reports.recent_events(limit=10_000) if e["kind"] == kind]

    deadline = time.monotonic() + 120
    while len(events("breaker_opened")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(events("breaker_opened")) >= 3, "the breaker did not open and re-open after failed probes"
    with provider.lock:
        provider.down = False
    for t in threads:
        t.join(180)
    assert len(results) == 5 and all(r.success for r in results)
    assert (
        all(p.status == "completed" for p in store.reports.list_pipelines())
        and len(store.reports.list_pipelines()) == 5
    )
    (breaker,) = store.providers.breakers()
    assert breaker["state"] == "closed" and breaker["consecutive_failures"] == 0

    history = sorted([(e["created_at"].timestamp(), e["kind"]) for e in store.reports.recent_events(limit=10_000)
                      if e["kind"].startswith("breaker_")])
    calls = [at for at, _, _ in provider.calls]
    opened = [at for at, kind in history if kind == "breaker_opened"]
    probes = [at for at, kind in history if kind == "breaker_half_open"]
    assert len(probes) >= len(opened) and [k for _, k in history][-1] == "breaker_closed"
    for start in opened:
        probe = min(at for at in probes if at > start)
        # in-flight calls may land just after the breaker opened; after that, none until the probe
        quiet = [at for at in calls if start + 0.5 < at < probe - 0.05]
        assert quiet == [], f"{len(quiet)} calls reached the provider while its breaker was open"
        nxt = min([at for at, _ in history if at > probe] + [float("inf")])
        assert len([at for at in calls if probe - 0.05 <= at < nxt]) >= 1  # the probe itself
    waited = {
        t["pipeline_id"]
        for p in store.reports.list_pipelines()
        for t in store.reports.transitions_for(pipeline_id=p.id)
        if t["to_status"] == "waiting"
    }
    assert len(waited) == 5  # every pipeline showed as waiting while the endpoint was down
    status = cli(db_url, "status")
    assert "Circuit breakers not closed: 0" in status


def test_degraded_items_are_redone_by_redo_degraded_through_a_resume_run(store, db_url, httpserver, tmp_path):
    shop = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    create_sample_database(shop)
    refused = frozenset({"customers", "orders"})
    provider = Provider(refuse_tables=refused)
    llm = serve(httpserver, provider)
    ontology = make_ontology_job(executor_def=in_process_executor)
    resources = {"recovery": recovery(db_url), "llm": llm, "source": SourceDatabase(url=shop)}
    # one Dagster instance, as in production: its sensor resumes only the pipelines whose first run it holds
    instance = DagsterInstance.ephemeral()
    first = execute_in_process(ontology, resources=resources, raise_on_error=False, instance=instance)
    assert first.success
    (p,) = store.reports.list_pipelines()
    assert p.status == "completed" and store.providers.degraded_counts(p.id) == {"enrich_entities": 2}
    statuses = store_rows.item_statuses(store, p.id, "enrich_entities")
    assert {k for k, s in statuses.items() if s == "degraded"} == refused
    assert "2 degraded" in cli(db_url, "pipelines", "show", str(p.id))

    provider.refuse_tables = frozenset()  # the provider answers these tables now
    out = cli(db_url, "redo-degraded", str(p.id), "--node", "enrich_entities")
    assert "2 degraded item(s) in enrich_entities" in out
    reopened = store.pipelines.get_pipeline(p.id)
    assert (reopened.status, reopened.owner) == ("running", None)
    assert store.pipelines.get_node(p.id, "enrich_entities").status == "pending"

    sensor = make_orphan_sensor([ontology])
    tick = sensor.evaluate_tick(build_sensor_context(instance=instance, resources={"recovery": recovery(db_url)}))
    (request,) = tick.run_requests
    before = len(provider.calls)
    resumed = execute_in_process(ontology, run_config=request.run_config, tags=request.tags, resources=resources,
                                 raise_on_error=False, instance=instance)
    assert resumed.success
    redone = provider.calls[before:]
    assert sorted((task, table) for _, task, table in redone) == [("describe_entity", "customers"),
                                                                 ("describe_entity", "orders")]
    done = store.pipelines.get_pipeline(p.id)
    assert done.status == "completed" and store.providers.degraded_counts(p.id) == {}
    with store.read() as conn:
        names = dict(conn.execute(select(ont_entities.c.table_name, ont_entities.c.name)).all())
    assert names["customers"] == "LLM customers" and names["orders"] == "LLM orders"
    instance.dispose()
    again = cli(db_url, "redo-degraded", str(p.id))
    assert "no degraded items" in again
