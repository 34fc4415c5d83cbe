"""A pipeline that crashes mid-node and is resumed, made through the store API (as the runs would make it)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from helpers import expire

from recovery_ext import scan
from recovery_ext._store.models import ItemCheckpoint, ProviderCall
from recovery_ext._store.store import RecoveryStore

NODES = ["extract", "enrich", "assemble"]
PRICE_IN, PRICE_OUT = 0.000002, 0.000008  # per token


class StandIn:
    """A local OpenAI-compatible chat endpoint that answers with ``usage`` and counts what it served."""

    def __init__(self) -> None:
        self.calls = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = sum(len(m["content"].split()) for m in body["messages"]) * 3
                completion = 5 + len(body["messages"][-1]["content"]) % 7
                with stand_in._lock:
                    stand_in.calls += 1
                    stand_in.tokens_in += prompt
                    stand_in.tokens_out += completion
                answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                                     "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def ask(self, item: str) -> ProviderCall:
        """One chat call for ``item``, as the ledger records it (tokens from the response's usage)."""
        reply = requests.post(f"{self.url}/chat/completions", timeout=10, json={
            "model": "stand-in-1", "messages": [{"role": "user", "content": f"name the entity of {item} please"}]})
        usage = reply.json()["usage"]
        tokens_in, tokens_out = usage["prompt_tokens"], usage["completion_tokens"]
        return ProviderCall(endpoint=self.url, model="stand-in-1", tokens_in=tokens_in, tokens_out=tokens_out,
                            latency_seconds=reply.elapsed.total_seconds(),
                            cost=tokens_in * PRICE_IN + tokens_out * PRICE_OUT)


@contextmanager
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    server._thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


@dataclass(frozen=True)
class CrashAndResume:
    pipeline_id: int
    first_run: str
    resume_run: str
    items_before: int
    items_after: int
    # The ledger's view of each call the scenario made: kept by run 1 (saved), wasted at the crash, by run 2
    saved: list[ProviderCall] = field(default_factory=list)
    wasted: list[ProviderCall] = field(default_factory=list)
    resumed: list[ProviderCall] = field(default_factory=list)


def crash_and_resume(store: RecoveryStore, *, name: str = "crashy", items_before: int = 3, items_after: int = 2,
                     wait: bool = True, provider: StandIn | None = None) -> CrashAndResume:
    """Run 1 does ``extract`` and ``items_before`` items of ``enrich`` (pausing once on an outage), then its
    heartbeat expires; the scan reclaims it; run 2 attaches, does the other ``items_after`` items and the rest.

    With ``provider`` each item asks it once and its checkpoint keeps the call; run 1 also asks for the next
    item and dies before checkpointing it (the call in flight at the crash: paid, never kept)."""
    saved: list[ProviderCall] = []
    wasted: list[ProviderCall] = []
    later: list[ProviderCall] = []
    first, second = f"{name}-run-1", f"{name}-run-2"
    total = items_before + items_after
    own = store.pipelines.create_pipeline("ontology", NODES, owner=first, origin_run_id=first)
    store.pipelines.start_node(own, "extract")
    store.pipelines.complete_node(own, "extract")
    store.pipelines.start_node(own, "enrich")
    store.pipelines.start_items(own, "enrich", total)
    for i in range(items_before):
        calls = (provider.ask(f"item-{i}"),) if provider else ()
        saved += calls
        store.pipelines.checkpoint_item(own, "enrich", ItemCheckpoint(f"item-{i}", {"n": i}, calls=calls))
        if wait and i == 0:
            store.providers.set_waiting(own, 0.01, "503 Service Unavailable", node="enrich")
            store.providers.clear_waiting(own, node="enrich")
    if provider:
        in_flight = provider.ask(f"item-{items_before}")
        in_flight = ProviderCall(**{**in_flight.__dict__, "pipeline_id": own.pipeline_id, "node_name": "enrich",
                                    "item_key": f"item-{items_before}", "run_id": first, "epoch": own.epoch})
        store.providers.record_provider_calls([in_flight])
        wasted.append(in_flight)
    expire(store, own.pipeline_id)
    stats = scan(store)
    assert [r.pipeline_id for r in stats.reclaimed_pipelines] == [own.pipeline_id]
    resumed = store.pipelines.attach(own.pipeline_id, second, resume_number=1)
    store.pipelines.start_node(resumed, "enrich")
    for i in range(items_before, total):
        calls = (provider.ask(f"item-{i}"),) if provider else ()
        later.extend(calls)
        store.pipelines.checkpoint_item(resumed, "enrich", ItemCheckpoint(f"item-{i}", {"n": i}, calls=calls))
    store.pipelines.complete_node(resumed, "enrich")
    store.pipelines.start_node(resumed, "assemble")
    store.pipelines.complete_node(resumed, "assemble")
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "completed"
    return CrashAndResume(own.pipeline_id, first, second, items_before, items_after, saved, wasted, later)
