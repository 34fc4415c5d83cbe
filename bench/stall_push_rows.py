"""How much a node's row grows on PostgreSQL when its items push its stall deadline, per item or by ``stall_push``.

One node checkpoints ``--items`` items one at a time with a stall timeout of 600 s (the deadline moves only when
less than that is left: here once), then another node as many with a stall timeout of a millisecond (every item
moves it, as every item did before ``stall_push``). The deadline is indexed, so each move writes a new version of
the node's row and of its index entries. It prints how much ``rx_nodes`` with its indexes grew in each phase
(after a VACUUM before each), and how many times each phase wrote the node's row (a trigger counts them).
Nothing is asserted: the figures go in the closing notes.

    .venv/bin/python -m bench.stall_push_rows [--items 10000]
"""

from __future__ import annotations

import argparse

import psycopg

from bench.batch_bench import running_node
from bench.recovery_bench import scratch_store
from recovery_ext._store.models import ItemCheckpoint

SIZE = "SELECT pg_total_relation_size('rx_nodes')"
# counts every write of a node's row: this bench times nothing, so the trigger's own cost does not matter
COUNT_WRITES = """
CREATE TABLE bench_node_writes (n bigint NOT NULL);
INSERT INTO bench_node_writes VALUES (0);
CREATE FUNCTION bench_node_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE bench_node_writes SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER bench_node_written AFTER UPDATE ON rx_nodes FOR EACH ROW EXECUTE FUNCTION bench_node_written();
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000, help="items per phase (default 10000)")
    args = parser.parse_args()
    with scratch_store() as (url, store), psycopg.connect(url, autocommit=True) as conn:
        conn.execute(COUNT_WRITES)
        print(f"rx_nodes on PostgreSQL, {args.items} one-item checkpoints per node")
        for label, stall in (("stall_push (600 s)", 600.0), ("every item (1 ms)", 0.001)):
            own = running_node(store, label)
            conn.execute("VACUUM rx_nodes")
            size = conn.execute(SIZE).fetchone()[0]  # type: ignore[index]
            writes = conn.execute("SELECT n FROM bench_node_writes").fetchone()[0]  # type: ignore[index]
            for i in range(args.items):
                store.pipelines.checkpoint_item(own, "items", ItemCheckpoint(f"k{i}", {"i": i}), stall_timeout=stall)
            grown = conn.execute(SIZE).fetchone()[0] - size  # type: ignore[index]
            written = conn.execute("SELECT n FROM bench_node_writes").fetchone()[0] - writes  # type: ignore[index]
            print(f"  {label:<20} rx_nodes grew {grown // 1024:6d} kB   writes of the node's row {written:6d}")

if __name__ == "__main__":
    main()
