"""Each PostgreSQL hot path written twice, side by side: the server function against the portable Python.

Node transitions (start + complete of a node) and the call journal's two fenced writes (begin + answer) exist as
PL/pgSQL functions (migrations 0008 and 0018, called through ``_store/hot_path.py``), and an item checkpoint as
one SQL statement of data-modifying CTEs (``sql/postgres/queries/checkpoint_*.sql``); each also exists as the
portable Python SQLite runs. This runs each ``--ops`` times per round on a scratch PostgreSQL database, once the
server's way and once with the portable Python forced (the dialect's ``node_functions``, ``journal_functions``
and ``dml_in_cte`` switched off), rounds alternating, and prints the median milliseconds per operation and the
ratio portable / server. The rule in docs/development.md: a hot path keeps one
source of truth, Python only if it measures within 10 % of the server function.

    .venv/bin/python -m bench.hot_path_bench [--ops 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import psycopg

from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import ItemCheckpoint, Ownership, ProviderCall
from recovery_ext.store import RecoveryStore

ADMIN = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def open_store(url: str, *, server_functions: bool) -> RecoveryStore:
    store = RecoveryStore(url)
    # a store picks its strategy once, from its dialect, on first use: set before any call
    store.dialect.node_functions = server_functions
    store.dialect.journal_functions = server_functions
    store.dialect.dml_in_cte = server_functions  # the checkpoint as one SQL statement, or SQLite's Python
    return store


def node_pairs(store: RecoveryStore, ops: int) -> float:
    owns = [store.pipelines.create_pipeline("bench", ["a"], owner=f"run-{uuid.uuid4()}") for _ in range(ops)]
    start = time.perf_counter()
    for own in owns:
        store.pipelines.start_node(own, "a")
        store.pipelines.complete_node(own, "a", {"n": 1})
    return (time.perf_counter() - start) * 1000 / ops


def journal_pairs(store: RecoveryStore, ops: int) -> float:
    own = store.pipelines.create_pipeline("bench", ["a"], owner=f"run-{uuid.uuid4()}")
    store.pipelines.start_node(own, "a")
    calls = [_call(own, f"item-{i}") for i in range(ops)]
    start = time.perf_counter()
    for i, call in enumerate(calls):
        store.providers.journal_begin(own, call, call_key=f"key-{i}")
        store.providers.journal_answer(own, _answered(call), call_key=f"key-{i}", answer='{"a": 1}')
    return (time.perf_counter() - start) * 1000 / ops


def checkpoints(store: RecoveryStore, ops: int) -> float:
    own = store.pipelines.create_pipeline("bench", ["a"], owner=f"run-{uuid.uuid4()}")
    store.pipelines.start_node(own, "a")
    entries = [ItemCheckpoint(f"item-{i}", {"n": i}) for i in range(ops)]
    start = time.perf_counter()
    for entry in entries:
        store.pipelines.checkpoint_item(own, "a", entry)
    return (time.perf_counter() - start) * 1000 / ops


def _call(own: Ownership, item: str) -> ProviderCall:
    return ProviderCall(endpoint="bench", model="m", outcome=IN_FLIGHT, pipeline_id=own.pipeline_id,
                        node_name="a", item_key=item, run_id=own.owner, epoch=own.epoch)


def _answered(call: ProviderCall) -> ProviderCall:
    return ProviderCall(endpoint=call.endpoint, model="m", pipeline_id=call.pipeline_id, node_name="a",
                        item_key=call.item_key, run_id=call.run_id, epoch=call.epoch, id=call.id, tokens_in=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="operation pairs per round and side")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    name = f"rx_hot_path_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    try:
        RecoveryStore(url).migrate()
        stores = {side: open_store(url, server_functions=side == "server") for side in ("server", "portable")}
        paths: dict[str, Callable[[RecoveryStore, int], float]] = {
            "node start + complete": node_pairs, "journal begin + answer": journal_pairs,
            "item checkpoint": checkpoints}
        for what, run in paths.items():
            samples: dict[str, list[float]] = {"server": [], "portable": []}
            run(stores["server"], 20)  # warm: prepared statements, the pool
            run(stores["portable"], 20)
            for _ in range(args.rounds):
                for side in ("server", "portable"):
                    samples[side].append(run(stores[side], args.ops))
            server, portable = (statistics.median(samples[s]) for s in ("server", "portable"))
            print(f"{what}: server function {server:.3f} ms, portable Python {portable:.3f} ms per operation "
                  f"(portable / server = {portable / server:.2f})")
        for store in stores.values():
            store.close()
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
