"""What recording a provider call in the ledger adds to a checkpointed item, side by side.

For each database (SQLite, PostgreSQL) an item is measured two ways, interleaved in rounds so both
see the same machine load:

* **checkpoint**: the item's checkpoint alone (``store.pipelines.checkpoint_item``), what a node pays per item
  without the ledger (and without a provider: the strictest comparison);
* **with ledger**: the call recorded (``CallRecorder.record``: it waits in memory) and written in
  the same checkpoint, as ``ctx.record_call`` + ``item.complete`` do;
* and, for scale, the same two with a real OpenAI-compatible call to a stand-in on 127.0.0.1
  (no latency of its own) in front of each checkpoint: the cost of an item of an LLM node.

Prints the median microseconds per item and the ratio (with ledger / without).

Run: .venv/bin/python -m bench.ledger_bench   (PostgreSQL at 127.0.0.1:5432; scratch databases are
created and dropped). RX_LEDGER_BENCH_ITEMS and RX_LEDGER_BENCH_ROUNDS set the items per round and the rounds.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from recovery_ext import ProviderCall
from recovery_ext._providers.ledger import CallRecorder
from recovery_ext._store.models import ItemCheckpoint
from recovery_ext._store.store import RecoveryStore

ADMIN = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ITEMS = int(os.environ.get("RX_LEDGER_BENCH_ITEMS", "200"))
ROUNDS = int(os.environ.get("RX_LEDGER_BENCH_ROUNDS", "11"))


def _pipeline(store: RecoveryStore, tag: str):
    own = store.pipelines.create_pipeline("bench", ["node"], owner=tag, origin_run_id=tag, params={})
    store.pipelines.start_node(own, "node")
    return own


def _round(store: RecoveryStore, recorder: CallRecorder, *, ledger: bool, ask=None) -> tuple[float, float]:
    """Microseconds per item for ITEMS items of a fresh pipeline: wall-clock, and this process's CPU (less
    disturbed by other work on a shared machine)."""
    own = _pipeline(store, uuid.uuid4().hex)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(ITEMS):
        usage = ask() if ask is not None else (120, 30)
        calls = ()
        if ledger:
            call = ProviderCall(endpoint="http://127.0.0.1/v1", model="m", tokens_in=usage[0], tokens_out=usage[1],
                                latency_seconds=0.001, cost=0.0001, pipeline_id=own.pipeline_id, node_name="node",
                                item_key=f"k{i}", run_id=own.owner, epoch=own.epoch)
            recorder.record(call)
            calls = (call,)
        store.pipelines.checkpoint_item(own, "node", ItemCheckpoint(f"k{i}", {"answer": i}, calls=calls))
        if ledger:
            recorder.written(calls)
    return (time.perf_counter() - start) / ITEMS * 1e6, (time.process_time() - cpu) / ITEMS * 1e6


def _stand_in():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    import openai
    from stand_in_llm import StandInProvider

    provider = StandInProvider()
    url = provider.start()
    client = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)

    def ask():
        response = client.chat.completions.create(model="m", messages=[
            {"role": "user", "content": '{"task": "describe_entity", "input": {"table": "orders", "columns": []}}'}])
        return response.usage.prompt_tokens, response.usage.completion_tokens

    return provider, ask


def measure(name: str, url: str, ask=None) -> tuple[float, float]:
    store = RecoveryStore(url)
    store.migrate()
    recorder = CallRecorder(store)
    try:
        for ledger in (False, True):  # warm up: prepared statements, caches
            _round(store, recorder, ledger=ledger, ask=ask)
        without, with_ledger = [], []
        for i in range(ROUNDS):  # alternate which goes first, so neither always follows the other
            pair = [(False, without), (True, with_ledger)]
            for ledger, samples in (pair if i % 2 == 0 else pair[::-1]):
                samples.append(_round(store, recorder, ledger=ledger, ask=ask))
        a, b = (statistics.median(s[0] for s in without), statistics.median(s[0] for s in with_ledger))
        ca, cb = (statistics.median(s[1] for s in without), statistics.median(s[1] for s in with_ledger))
        label = f"{name}{' + LLM call' if ask else ''}"
        print(f"{label:<24} {a:9.1f} {b:9.1f} {b / a:7.3f}   {ca:9.1f} {cb:9.1f} {cb / ca:7.3f}   "
              f"({recorder.pending} unwritten)")
        return a, b
    finally:
        store.close()


def main() -> None:
    print(f"{ITEMS} items per round, {ROUNDS} rounds, medians in us per item; ratio = with ledger / without")
    print(f"{'':<24} {'wall':>9} {'+ledger':>9} {'ratio':>7}   {'cpu':>9} {'+ledger':>9} {'ratio':>7}")
    provider, ask = _stand_in()
    with tempfile.TemporaryDirectory() as tmp:
        measure("sqlite", f"sqlite:///{tmp}/bench.sqlite3")
        measure("sqlite", f"sqlite:///{tmp}/bench2.sqlite3", ask)
    name = f"rx_ledger_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{ADMIN.rsplit('/', 1)[0]}/{name}"
        measure("postgresql", url)
        measure("postgresql", url, ask)
    finally:
        with psycopg.connect(ADMIN.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        provider.stop()


if __name__ == "__main__":
    main()
