"""A third labelled corpus: libraries the classifier has no family for (the HTTP half).

Every case drives a real client against a server on 127.0.0.1 that the corpus starts
(:class:`ScriptedHTTP` answers each request with the reply scripted last) and keeps the exception it
raised: more LLM SDKs and their streams (Groq, Ollama), a model hub (huggingface_hub), search engines
(Elasticsearch, OpenSearch, Meilisearch, Typesense). The other half (brokers, file transfer, a document
store, OCR binaries, output parsers, this machine's resources) is tests/support/classify_corpus_local.py.

Labels follow the policy, set before any scoring: transient are connection loss, timeouts, 408/429/5xx
(not 501), throttling, overload, locks, a remote server out of room; permanent is everything else, and
this machine's own resources running out (file descriptors, memory, disk, a read-only file system).
"""

from __future__ import annotations

import json

from classify_corpus import _free_port
from classify_corpus_libraries import PERMANENT, TRANSIENT, LibCase, case
from classify_corpus_servers import ScriptedHTTP

JSON = {"Content-Type": "application/json"}
ELASTIC = {**JSON, "X-Elastic-Product": "Elasticsearch"}
# status -> the label the policy gives it
STATUSES = {400: PERMANENT, 401: PERMANENT, 403: PERMANENT, 404: PERMANENT, 408: TRANSIENT, 409: PERMANENT,
            413: PERMANENT, 422: PERMANENT, 429: TRANSIENT, 500: TRANSIENT, 501: PERMANENT, 502: TRANSIENT,
            503: TRANSIENT, 504: TRANSIENT}
CLOSED = f"http://127.0.0.1:{_free_port()}"


def _each_status(http: ScriptedHTTP, prefix: str, call, body, headers, how: str,
                 statuses: dict[int, bool] = STATUSES) -> list[LibCase]:
    cases = []
    for status, label in statuses.items():
        http.script(status, body(status), headers)
        cases.append(case(f"{prefix}-{status}", label, call, f"{how}; the local server answered HTTP {status}"))
    return cases


def _transport(http: ScriptedHTTP, prefix: str, call_at, what: str) -> list[LibCase]:
    """The same client against a closed port, a server that stalls past the read timeout, and one that hangs up."""
    cases = [case(f"{prefix}-refused", TRANSIENT, call_at(CLOSED), f"{what} against a closed port")]
    http.script(200, "{}", JSON, action="stall")
    cases.append(case(f"{prefix}-read-timeout", TRANSIENT, call_at(http.url),
                      f"{what}, read timeout 1 s or less, the server stalls 1.5 s"))
    http.script(action="close")
    cases.append(case(f"{prefix}-closed", TRANSIENT, call_at(http.url),
                      f"{what}, the server closes the connection without answering"))
    return cases


def groq_cases(http: ScriptedHTTP) -> list[LibCase]:
    import groq

    def at(url: str):
        client = groq.Groq(api_key="gsk-corpus", base_url=url, max_retries=0, timeout=1)
        return lambda: client.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "x"}])

    def body(status):
        return json.dumps({"error": {"message": f"corpus {status}", "type": "corpus_error"}})
    cases = _each_status(http, "groq", at(http.url), body, JSON, "groq SDK chat.completions.create, max_retries 0")
    event = {"error": {"message": "Service Unavailable", "type": "internal_server_error"}}
    http.script(200, f"data: {json.dumps(event)}\n\n",
                {"Content-Type": "text/event-stream"})
    client = groq.Groq(api_key="gsk-corpus", base_url=http.url, max_retries=0, timeout=2)
    cases.append(case("groq-stream-error-event", TRANSIENT,
                      lambda: list(client.chat.completions.create(model="m", messages=[], stream=True)),
                      "groq SDK stream=True; HTTP 200 event stream whose first event is an internal_server_error"))
    return cases + _transport(http, "groq", at, "groq SDK chat.completions.create")


def ollama_cases(http: ScriptedHTTP) -> list[LibCase]:
    import ollama

    def at(url: str):
        client = ollama.Client(host=url, timeout=1)
        return lambda: client.chat(model="llama3", messages=[{"role": "user", "content": "x"}])

    statuses = {s: label for s, label in STATUSES.items() if s not in (408, 409, 413, 501)}
    cases = _each_status(http, "ollama", at(http.url), lambda status: json.dumps({"error": f"corpus {status}"}), JSON,
                         "ollama Client.chat", statuses)
    client = ollama.Client(host=http.url, timeout=2)
    for name, message, label in [
        ("busy", "server busy, please try again.  maximum pending requests exceeded", TRANSIENT),
        ("overloaded", "model is overloaded, please retry", TRANSIENT),
        ("runner-gone", "an error was encountered while running the model: unexpected EOF", TRANSIENT),
        ("model-missing", "model 'llama9' not found", PERMANENT),
        ("context", "input length exceeds the context length", PERMANENT),
    ]:
        http.script(200, json.dumps({"error": message}) + "\n", {"Content-Type": "application/x-ndjson"})
        cases.append(case(f"ollama-stream-{name}", label,
                          lambda: list(client.chat(model="llama3", messages=[], stream=True)),
                          f"ollama Client.chat stream=True; HTTP 200 NDJSON whose first line is an error: {message}"))
    # Ollama's timeouts and cut connections are httpx's own exceptions (httpx has a family): only its refusal is its own
    return cases + [case("ollama-refused", TRANSIENT, at(CLOSED), "ollama Client.chat against a closed port")]


def hub_cases(http: ScriptedHTTP) -> list[LibCase]:
    from huggingface_hub import HfApi

    def at(url: str):
        api = HfApi(endpoint=url, token=False)
        return lambda: api.model_info("corpus/model", timeout=1)

    cases = []
    for status, code, label in [(401, "RepoNotFound", PERMANENT), (403, "GatedRepo", PERMANENT),
                                (404, "RepoNotFound", PERMANENT), (404, "EntryNotFound", PERMANENT),
                                (404, "RevisionNotFound", PERMANENT), (400, "BadRequest", PERMANENT),
                                (429, "", TRANSIENT), (500, "", TRANSIENT), (502, "", TRANSIENT), (503, "", TRANSIENT),
                                (504, "", TRANSIENT)]:
        http.script(status, f"corpus {code or status}", {"X-Error-Code": code} if code else {})
        cases.append(case(f"hub-{status}-{code or 'plain'}", label, at(http.url),
                          f"huggingface_hub HfApi.model_info; HTTP {status} X-Error-Code {code or '(none)'}"))
    return cases  # its transport errors are httpx2's own (a family has them)


def elastic_cases(http: ScriptedHTTP) -> list[LibCase]:
    import elasticsearch
    from elasticsearch import helpers

    def at(url: str):
        client = elasticsearch.Elasticsearch(url, max_retries=0, request_timeout=1, retry_on_timeout=False)
        return lambda: client.search(index="docs", query={"match_all": {}})

    kinds = {429: "es_rejected_execution_exception", 503: "cluster_block_exception", 500: "exception",
             504: "timeout_exception", 502: "proxy_error", 400: "parsing_exception", 401: "security_exception",
             403: "security_exception", 404: "index_not_found_exception", 409: "version_conflict_engine_exception",
             413: "content_too_long_exception"}
    def body(status):
        return json.dumps({"error": {"type": kinds.get(status, "x"), "reason": "corpus"}, "status": status})
    cases = _each_status(http, "elastic", at(http.url), body, ELASTIC, "elasticsearch-py search",
                         {s: STATUSES[s] for s in kinds})
    client = elasticsearch.Elasticsearch(http.url, max_retries=0, request_timeout=2)
    for name, items, label in [
        ("rejected", [(429, "es_rejected_execution_exception")], TRANSIENT),
        ("all-rejected", [(429, "es_rejected_execution_exception"), (429, "es_rejected_execution_exception")],
         TRANSIENT),
        ("unavailable-shard", [(503, "unavailable_shards_exception")], TRANSIENT),
        ("mapping", [(400, "mapper_parsing_exception")], PERMANENT),
        ("mixed", [(429, "es_rejected_execution_exception"), (400, "mapper_parsing_exception")], PERMANENT),
    ]:
        answer = {"took": 1, "errors": True, "items": [
            {"index": {"_index": "docs", "_id": str(n), "status": status, "error": {"type": kind, "reason": "corpus"}}}
            for n, (status, kind) in enumerate(items)]}
        http.script(200, json.dumps(answer), ELASTIC)
        docs = [{"_index": "docs", "_id": str(n), "text": "x"} for n in range(len(items))]
        cases.append(case(f"elastic-bulk-{name}", label, lambda docs=docs: helpers.bulk(client, docs, max_retries=0),
                          f"elasticsearch helpers.bulk; HTTP 200 whose per-item errors are {items}"))
    return cases + _transport(http, "elastic", at, "elasticsearch-py search")


def opensearch_cases(http: ScriptedHTTP) -> list[LibCase]:
    import opensearchpy

    def at(url: str):
        client = opensearchpy.OpenSearch([url], max_retries=0, timeout=1)
        return lambda: client.search(index="docs", body={"query": {"match_all": {}}})

    def body(status):
        return json.dumps({"error": {"type": "corpus_exception", "reason": "corpus"}, "status": status})
    statuses = {s: STATUSES[s] for s in (400, 401, 403, 404, 409, 429, 500, 502, 503, 504)}
    return (_each_status(http, "opensearch", at(http.url), body, JSON, "opensearch-py search", statuses)
            + _transport(http, "opensearch", at, "opensearch-py search"))


def meili_cases(http: ScriptedHTTP) -> list[LibCase]:
    import meilisearch

    def at(url: str):
        client = meilisearch.Client(url, "corpus-key", timeout=1)
        return lambda: client.index("docs").search("invoice")

    cases = []
    for status, code, label in [(429, "too_many_search_requests", TRANSIENT), (503, "search_queue_full", TRANSIENT),
                                (500, "internal", TRANSIENT), (404, "index_not_found", PERMANENT),
                                (400, "invalid_search_q", PERMANENT), (401, "missing_authorization_header", PERMANENT),
                                (403, "invalid_api_key", PERMANENT), (413, "payload_too_large", PERMANENT)]:
        http.script(status, json.dumps({"message": f"corpus {code}", "code": code, "type": "x", "link": "x"}), JSON)
        cases.append(case(f"meili-{status}-{code}", label, at(http.url),
                          f"meilisearch index.search; HTTP {status} with code {code}"))
    return cases + _transport(http, "meili", at, "meilisearch index.search")


def typesense_cases(http: ScriptedHTTP) -> list[LibCase]:
    import typesense

    def at(url: str):
        port = int(url.rsplit(":", 1)[1])
        client = typesense.Client({"nodes": [{"host": "127.0.0.1", "port": port, "protocol": "http"}],
                                   "api_key": "corpus", "connection_timeout_seconds": 1, "num_retries": 0})
        return lambda: client.collections["docs"].documents.search({"q": "invoice", "query_by": "text"})

    statuses = {s: STATUSES[s] for s in (400, 401, 404, 409, 422, 429, 500, 503)}
    # its transport errors are httpx's own (a family has them): only its status errors are its own
    return _each_status(http, "typesense", at(http.url), lambda status: json.dumps({"message": f"corpus {status}"}),
                        JSON, "typesense documents.search", statuses)


def build_http_generic_corpus() -> list[LibCase]:
    http = ScriptedHTTP()
    try:
        return [c for build in (groq_cases, ollama_cases, hub_cases, elastic_cases, opensearch_cases, meili_cases,
                                typesense_cases) for c in build(http)]
    finally:
        http.close()
