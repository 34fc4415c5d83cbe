"""What the call journal costs: per call against a provider answering in 200 ms, and in storage for a 100 KB answer.

For each database (SQLite, PostgreSQL):

* **overhead**: CALLS real OpenAI-compatible calls (the ``openai`` SDK) to the stand-in on 127.0.0.1,
  answering in 200 ms, each wrapped in the journal's two fenced writes (``journal_begin`` before the
  request: look-up and the ledger row in flight; ``journal_answer`` after: the answer kept and the row
  completed), as a journaled call makes them. Prints the median wall-clock of the two writes, the median
  call, and their ratio (the journal's share of the call; the target is at most 2 %).
* **100 KB answer**: one answer of about 100 KB of JSON text journaled and replayed: the bytes the row
  keeps (the answer's text; on PostgreSQL also the table's on-disk size, TOAST compressed), the time to
  keep and to replay it, and the storage left once its pipeline completed (the trigger prunes it).

Run: .venv/bin/python -m bench.journal_bench   (PostgreSQL at 127.0.0.1:5432; a scratch database is created
and dropped). RX_JOURNAL_BENCH_CALLS sets the calls per database (default 100).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from recovery_ext import ProviderCall
from recovery_ext._providers.journal import decode_answer, encode_answer
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.store import RecoveryStore

ADMIN = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
CALLS = int(os.environ.get("RX_JOURNAL_BENCH_CALLS", "100"))
LATENCY = 0.2


def _rows():
    """The tests' reads of the journal's and the ledger's rows (the store offers only what the library calls)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    import store_rows

    return store_rows


def _stand_in():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    import openai
    from stand_in_llm import StandInProvider

    provider = StandInProvider(latency=LATENCY)
    client = openai.OpenAI(base_url=provider.start(), api_key="x", max_retries=0)
    return provider, client


def _pipeline(store: RecoveryStore):
    tag = uuid.uuid4().hex
    own = store.pipelines.create_pipeline("bench", ["node"], owner=tag, origin_run_id=tag, params={})
    store.pipelines.start_node(own, "node")
    return own


def _in_flight(own, item: str) -> ProviderCall:
    return ProviderCall(endpoint="http://127.0.0.1/v1", model="m", outcome=IN_FLIGHT, pipeline_id=own.pipeline_id,
                        node_name="node", item_key=item, run_id=own.owner, epoch=own.epoch)


def overhead(store: RecoveryStore, client) -> tuple[float, float, float]:
    """Median seconds of the journal's two writes per call (wall-clock, and this process's CPU: less disturbed
    by other work on a shared machine), and median seconds of the call itself."""
    own = _pipeline(store)
    writes, cpu, calls = [], [], []
    for i in range(CALLS):
        body = {"task": "describe_entity", "input": {"table": f"t{i}", "columns": []}}
        call = _in_flight(own, f"k{i}")
        start, cpu_start = time.perf_counter(), time.process_time()
        store.providers.journal_begin(own, call, call_key=f"fp{i}#1")
        sent, cpu_sent = time.perf_counter(), time.process_time()
        response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": json.dumps(body)}])
        answered, cpu_answered = time.perf_counter(), time.process_time()
        done = ProviderCall(endpoint=call.endpoint, model="m", tokens_in=response.usage.prompt_tokens,
                            tokens_out=response.usage.completion_tokens, latency_seconds=answered - sent,
                            pipeline_id=own.pipeline_id, node_name="node", item_key=f"k{i}", run_id=own.owner,
                            epoch=own.epoch, id=call.id)
        store.providers.journal_answer(own, done, call_key=f"fp{i}#1", answer=encode_answer(response))
        end, cpu_end = time.perf_counter(), time.process_time()
        writes.append((sent - start) + (end - answered))
        cpu.append((cpu_sent - cpu_start) + (cpu_end - cpu_answered))
        calls.append(answered - sent)
    return statistics.median(writes), statistics.median(cpu), statistics.median(calls)


def big_answer(store: RecoveryStore) -> dict:
    words = ["customer", "order", "invoice", "amount", "shipped", "region", "status", "the", "of", "per", "total"]
    rng = random.Random(7)
    columns = {}
    while len(json.dumps(columns)) < 100_000:
        columns[f"col_{len(columns)}"] = " ".join(rng.choice(words) for _ in range(20)) + "."
    answer = {"columns": columns}
    encoded = encode_answer(answer)
    own = _pipeline(store)
    before = _table_bytes(store)
    call = _in_flight(own, "big")
    store.providers.journal_begin(own, call, call_key="big#1")
    start = time.perf_counter()
    store.providers.journal_answer(own, call, call_key="big#1", answer=encoded)
    kept_seconds = time.perf_counter() - start
    entries, chars = _rows().call_journal_size(store, own.pipeline_id)
    on_disk = _table_bytes(store) - before
    start = time.perf_counter()
    hit = store.providers.journal_begin(own, _in_flight(own, "big"), call_key="big#1")
    replayed = decode_answer(hit.answer)
    replay_seconds = time.perf_counter() - start
    assert replayed == answer
    store.pipelines.checkpoint_item(own, "node", _checkpoint("big"))
    store.pipelines.complete_node(own, "node")  # the pipeline completes: the trigger prunes its entries
    return {"answer_json_bytes": len(json.dumps(answer)), "kept_chars": chars, "entries": entries,
            "table_bytes_added": on_disk, "keep_ms": kept_seconds * 1000, "replay_ms": replay_seconds * 1000,
            "entries_after_completion": _rows().call_journal_size(store, own.pipeline_id)[0],
            "ledger_rows_after_completion": len(_rows().provider_calls(store, own.pipeline_id))}


def _checkpoint(key: str):
    from recovery_ext._store.models import ItemCheckpoint

    return ItemCheckpoint(key, 1)


def _table_bytes(store: RecoveryStore) -> int:
    """The journal table's bytes on disk: PostgreSQL's relation with its TOAST; SQLite's pages (dbstat)."""
    with store.read() as conn:
        return store.dialect.table_bytes(conn, "rx_call_journal")


def run(label: str, url: str, client) -> None:
    store = RecoveryStore(url)
    store.migrate()
    try:
        writes, cpu, call = overhead(store, client)
        print(f"{label}: journal writes per call {writes * 1000:.2f} ms wall, {cpu * 1000:.2f} ms CPU (medians of "
              f"{CALLS}); call {call * 1000:.1f} ms; overhead {writes / call * 100:.2f} % wall, "
              f"{cpu / call * 100:.2f} % CPU")
        big = big_answer(store)
        print(f"{label}: 100 KB answer: {json.dumps(big)}")
    finally:
        store.close()


def main() -> None:
    provider, client = _stand_in()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run("SQLite", f"sqlite:///{tmp}/bench.sqlite3", client)
        name = f"rx_journal_bench_{uuid.uuid4().hex[:8]}"
        admin = ADMIN.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            run("PostgreSQL", admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}",
                client)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        provider.stop()


if __name__ == "__main__":
    main()
