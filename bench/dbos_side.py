"""The DBOS half of bench/dbos_bench.py; runs in DBOS's own environment (.venv-dbos), never imported
by recovery_ext. Prints one JSON line with its figures.

    python bench/dbos_side.py steps URL N            N checkpointed steps in one workflow
    python bench/dbos_side.py interrupt URL N        start N workflows, print "ready" once all are mid-way
    python bench/dbos_side.py recover URL N          launch: recover the N interrupted workflows
"""

from __future__ import annotations

import json
import sys
import threading
import time

import psycopg
from dbos import DBOS, DBOSConfig

MODE, URL, COUNT = sys.argv[1], sys.argv[2], int(sys.argv[3])
RESUMED = threading.Semaphore(0)
RECOVERING = MODE == "recover"

DBOS(config=DBOSConfig(name="rx_dbos_bench", system_database_url=URL, log_level="ERROR"))


@DBOS.step()
def checkpointed(i: int) -> int:
    return i


@DBOS.step()
def first_half(i: int) -> int:
    return i


@DBOS.step()
def second_half(i: int) -> int:
    if RECOVERING:
        RESUMED.release()  # running again: its first step was replayed from its checkpoint
        return i
    time.sleep(3600)  # the interrupting process is kill -9ed here
    return i


@DBOS.workflow()
def many_steps(n: int) -> int:
    total = 0
    for i in range(n):
        total += checkpointed(i)
    return total


@DBOS.workflow()
def interrupted(i: int) -> int:
    first_half(i)
    return second_half(i)


def main() -> None:
    if MODE == "steps":
        DBOS.launch()
        many_steps(10)  # warm-up
        start = time.perf_counter()
        many_steps(COUNT)
        seconds = time.perf_counter() - start
        print(json.dumps({"steps": COUNT, "seconds": seconds}), flush=True)
    elif MODE == "interrupt":
        DBOS.launch()
        for i in range(COUNT):
            DBOS.start_workflow(interrupted, i)
        with psycopg.connect(URL, autocommit=True) as conn:  # until every workflow checkpointed its first step
            while conn.execute("SELECT count(*) FROM dbos.operation_outputs WHERE function_name LIKE "
                               "'%first_half'").fetchone()[0] < COUNT:
                time.sleep(0.2)
        print("ready", flush=True)
        time.sleep(3600)
    elif MODE == "recover":
        start = time.perf_counter()
        DBOS.launch()  # recovers the PENDING workflows of executor "local"
        launched = time.perf_counter() - start
        for _ in range(COUNT):
            RESUMED.acquire(timeout=600)
        running = time.perf_counter() - start
        print(json.dumps({"workflows": COUNT, "launch_seconds": launched, "running_again_seconds": running}),
              flush=True)
        DBOS.destroy(workflow_completion_timeout_sec=0)


if __name__ == "__main__":
    main()
