"""Functions run in child processes by the concurrency and crash tests (spawned, not forked)."""

from __future__ import annotations

import os
import sys
import threading

from helpers import reclaim


def reclaim_all(url: str, owner_tag: str, barrier, out_queue) -> None:
    from recovery_ext._store.models import PassPlan
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(url)
    won: list[int] = []
    barrier.wait()
    while True:
        reclaimed, _ = reclaim(store, PassPlan(limit=7, launching=True, grace_seconds=600))
        if not reclaimed:
            break
        won.extend(r.pipeline_id for r in reclaimed)
    out_queue.put((owner_tag, won))
    store.close()


def claim_all(url: str, worker: str, barrier, out_queue) -> None:
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(url)
    got: list[int] = []
    barrier.wait()
    while True:
        items = store.queue.claim("q", worker, limit=3, heartbeat_timeout=600)
        if not items:
            break
        for item in items:
            store.queue.complete_item(item, {"by": worker})
            got.append(item.id)
    out_queue.put((worker, got))
    store.close()


def run_watchdog_forever(url: str, pipeline_id: int, epoch: int, owner: str, interval: float, timeout: float) -> None:
    """Own a node with a live watchdog until killed."""
    from recovery_ext._liveness.heartbeat import HeartbeatSettings, Watchdog, store_pulse
    from recovery_ext._store.models import Ownership
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(url)
    own = Ownership(pipeline_id, epoch, owner)
    store.pipelines.start_node(own, "work", heartbeat_timeout=timeout)
    dog = Watchdog(store_pulse(store, own, "work", timeout), HeartbeatSettings(interval=interval, timeout=timeout))
    dog.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    threading.Event().wait()  # work "forever", until kill -9


if __name__ == "__main__":
    url, pid, epoch, owner, interval, timeout = sys.argv[1:]
    run_watchdog_forever(url, int(pid), int(epoch), owner, float(interval), float(timeout))
    os._exit(0)


def run_fenced_writer(url: str, items: int) -> None:
    """A recoverable op that writes through the op API (ctx.transaction and item.complete(also=...)) slowly."""
    import time

    from dagster import in_process_executor, job
    from sqlalchemy import Column, Integer, MetaData, Table, Text, insert

    from recovery_ext import RecoveryResource, execute_in_process, recoverable_op

    meta = MetaData()
    writes = Table("zombie_writes", meta, Column("id", Integer, primary_key=True), Column("what", Text))

    @recoverable_op
    def writer(ctx):
        for item in ctx.items(str(i) for i in range(items)):
            with ctx.transaction() as tx:
                tx.execute(insert(writes).values(what=f"transaction {item.key}"))
            time.sleep(0.1)
            item.complete({"k": item.key}, also=lambda tx, key=item.key: tx.execute(
                insert(writes).values(what=f"checkpoint {key}")))
        return items

    @job(executor_def=in_process_executor)
    def zombie_job():
        writer()

    # A zombie frozen inside a transaction comes back to a session the server ended, its store retry budget (the
    # heartbeat timeout, 3 s) spent during the freeze: the store still tries that call once on a new session, and
    # asks a new session's fence before it reports the loss of ctx.transaction()'s; either way the fence says
    # superseded (tests/store/test_lost_session.py).
    resource = RecoveryResource(database_url=url, heartbeat_interval=0.5, heartbeat_timeout=3)
    meta.create_all(resource.get_store().engine)
    result = execute_in_process(zombie_job, resources={"recovery": resource}, raise_on_error=False)
    failure = next((str(e.event_specific_data.error.message) for e in result.all_events
                    if e.event_type_value == "STEP_FAILURE"), "")
    sys.stdout.write(f"success={result.success} failure={failure}\n")
    sys.stdout.flush()
