"""Both real jobs on the sample inputs, on SQLite and PostgreSQL, with a local OpenAI-compatible server."""

from __future__ import annotations

import json
import threading

import pytest
from dagster import in_process_executor
from shipped_jobs import ocr_job_for, recovery
from sqlalchemy import select
from werkzeug import Response

from recovery_ext import execute_in_process
from recovery_pipelines.ontology_schema import ont_columns, ont_entities, ont_glossary_terms, ont_relationships
from recovery_pipelines import ocr as ocr_module
from recovery_pipelines.llm import LLMResource, heuristic_answer
from recovery_pipelines.ontology import SourceDatabase, make_ontology_job
from recovery_pipelines.sample_data import (
    CONVENTIONAL_RELATIONSHIPS,
    DECLARED_RELATIONSHIPS,
    create_sample_database,
    create_scanned_pdfs,
)
from recovery_ext._store.schema import events, nodes, pipelines, transitions

API_KEY = "sk-test-SECRET-0123456789abcdef"


@pytest.fixture(scope="module")
def shop_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('shop') / 'shop.sqlite3'}"
    create_sample_database(url)
    return url


def run_ontology(store, db_url, shop_url, llm=None):
    job = make_ontology_job(executor_def=in_process_executor)
    return execute_in_process(job, resources={"recovery": recovery(db_url), "llm": llm or LLMResource(),
                                              "source": SourceDatabase(url=shop_url)}, raise_on_error=False)


class FakeLLM:
    """An OpenAI-compatible chat-completions server: fails with the given statuses first, then answers."""

    def __init__(self, failures=(), always=None):
        self.failures = list(failures)
        self.always = always
        self.requests = []
        self.lock = threading.Lock()

    def __call__(self, request):
        with self.lock:
            self.requests.append(request.headers.get("Authorization", ""))
            status = self.always or (self.failures.pop(0) if self.failures else None)
        if status:
            return Response(json.dumps({"error": {"message": f"upstream said {status}", "type": "server"}}),
                            status=status, content_type="application/json")
        body = json.loads(request.data)
        prompt = json.loads(body["messages"][-1]["content"])
        content = json.dumps(heuristic_answer(prompt["task"], prompt["input"]))
        return Response(json.dumps({
            "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }), content_type="application/json")


def llm_for(httpserver, fake):
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(fake)
    return LLMResource(base_url=httpserver.url_for("/v1"), model="test-model", api_key=API_KEY, timeout=5,
                       initial_delay=0.01, max_delay=0.02)


def test_ontology_job_completes_and_finds_declared_and_conventional_relationships(store, db_url, shop_url):
    result = run_ontology(store, db_url, shop_url)
    assert result.success
    (p,) = store.reports.list_pipelines()
    assert p.status == "completed"
    with store.read() as conn:
        rels = {(r.from_table, r.from_column, r.to_table, r.to_column): r.kind
                for r in conn.execute(select(ont_relationships))}
        entities = {r.table_name: r.name for r in conn.execute(select(ont_entities))}
        columns = conn.execute(select(ont_columns).where(ont_columns.c.table_name == "orders")).all()
        terms = conn.execute(select(ont_glossary_terms)).all()
    assert {k for k, kind in rels.items() if kind == "declared"} == DECLARED_RELATIONSHIPS
    assert {k for k, kind in rels.items() if kind == "convention"} == CONVENTIONAL_RELATIONSHIPS
    assert len({r[0] for r in rels}) >= 8 and entities["order_items"] == "OrderItem"
    status = next(c for c in columns if c.column_name == "status")
    assert status.row_count == 300 and status.distinct_count == 5 and status.null_ratio == 0
    assert status.description and len(status.sample_values) == 3
    assert terms and all(t.sql_hint for t in terms)
    enrich = next(e for e in result.all_events if e.step_key == "enrich_columns"
                  and e.event_type_value == "STEP_OUTPUT")
    assert "heuristic" in str(enrich.event_specific_data.metadata["llm"].value)


def test_rerunning_the_ontology_is_idempotent(store, db_url, shop_url):
    run_ontology(store, db_url, shop_url)
    with store.read() as conn:
        first = {t.name: len(conn.execute(select(t)).all()) for t in (ont_columns, ont_relationships, ont_entities)}
    assert run_ontology(store, db_url, shop_url).success
    with store.read() as conn:
        second = {t.name: len(conn.execute(select(t)).all()) for t in (ont_columns, ont_relationships, ont_entities)}
    assert first == second


def test_llm_answering_503_and_429_for_a_while_still_completes(store, db_url, shop_url, httpserver):
    fake = FakeLLM(failures=[503, 503, 429, 503])
    result = run_ontology(store, db_url, shop_url, llm_for(httpserver, fake))
    assert result.success
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"
    assert len(fake.requests) > 4 and all(h == f"Bearer {API_KEY}" for h in fake.requests)
    with store.read() as conn:
        by = conn.execute(select(ont_columns.c.described_by).where(ont_columns.c.table_name == "orders")).scalars()
        assert all("openai-compatible model=test-model" in b for b in by)


def test_llm_401_fails_the_node_with_context_and_the_key_appears_nowhere(store, db_url, shop_url, httpserver,
                                                                           caplog):
    result = run_ontology(store, db_url, shop_url, llm_for(httpserver, FakeLLM(always=401)))
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "enrich_columns"
    message = str(failure.event_specific_data.error)
    assert "auth HTTP 401 model=test-model endpoint=http://" in message
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "failed"
    with store.read() as conn:
        dumped = " ".join(str(r) for t in (pipelines, nodes, events, transitions, ont_entities)
                          for r in conn.execute(select(t)))
    logs = " ".join(str(e) for e in result.all_events)
    assert "401" in dumped
    for text in (dumped, logs, message, caplog.text):
        assert API_KEY not in text and "SECRET" not in text


def test_failing_optional_glossary_nodes_degrade_and_the_pipeline_completes(store, db_url, shop_url, httpserver):
    class GlossaryDown(FakeLLM):
        def __call__(self, request):
            task = json.loads(json.loads(request.data)["messages"][-1]["content"])["task"]
            if task in ("glossary", "enrich_term"):
                return Response("overloaded", status=503)
            return super().__call__(request)

    llm = llm_for(httpserver, GlossaryDown())
    result = run_ontology(store, db_url, shop_url, llm)
    assert result.success
    (p,) = store.reports.list_pipelines()
    statuses = {n.name: n.status for n in store.pipelines.list_nodes(p.id)}
    assert store.pipelines.get_pipeline(p.id).status == "completed"
    assert statuses["discover_glossary"] == "degraded" and statuses["enrich_glossary"] in ("degraded", "completed")
    assert statuses["finalize"] == "completed"
    assert result.output_for_node("finalize")["degraded"] == [n for n, s in statuses.items() if s == "degraded"]


def test_ocr_failures_are_classified_retried_and_dead_at_max_attempts(store, db_url, tmp_path, monkeypatch):
    folder = tmp_path / "in"
    create_scanned_pdfs(folder, {"flaky.pdf": ["FLAKY"], "broken.pdf": ["BROKEN"]})

    def failing(path, **kw):
        if path.name == "flaky.pdf":
            raise TimeoutError("OCR engine timed out")
        raise ValueError("unsupported PDF structure")

    monkeypatch.setattr(ocr_module, "recognise", failing)
    result = execute_in_process(ocr_job_for(folder), resources={"recovery": recovery(db_url)})
    assert result.success
    items = {i.payload["name"]: i for i in store.queue.list_items("ocr")}
    assert (items["flaky.pdf"].status, items["flaky.pdf"].attempts) == ("dead", 3)
    assert "timeout" in items["flaky.pdf"].last_error
    assert (items["broken.pdf"].status, items["broken.pdf"].attempts) == ("failed", 1)
    assert result.output_for_node("ocr_documents") == {
        "queue": "ocr",
        "items_done": 0,
        "items_failed": 3,
        "items_dead": 1,
    }
