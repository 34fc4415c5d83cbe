"""Races and crashes against real databases: exactly-once reclaim and claim, kill -9 detection."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import update

from recovery_pipelines.devserver import wait_for
from recovery_ext._liveness.heartbeat import HeartbeatSettings, Watchdog, store_pulse
from recovery_ext._store.models import PassPlan, PipelineLimits
from recovery_ext._store.schema import pipelines
from recovery_ext._store.store import RecoveryStore
from helpers import expire, reclaim, reclaim_until_taken

ORPHANS = 200


def seed_orphans(store: RecoveryStore, n: int = ORPHANS) -> set[int]:
    ids = set()
    for i in range(n):
        own = store.pipelines.create_pipeline("job", ["a", "b"], owner=f"dead-{i}", origin_run_id=f"dead-{i}")
        store.pipelines.start_node(own, "a")
        ids.add(own.pipeline_id)
    with store.write() as conn:
        conn.execute(update(pipelines).values(heartbeat_deadline=store.dialect.now_plus(-10)))
    return ids


def assert_each_once(ids: set[int], results: list[list[int]], store: RecoveryStore) -> None:
    won = Counter(pid for r in results for pid in r)
    assert set(won) == ids
    assert max(won.values()) == 1
    assert all(store.pipelines.get_pipeline(pid).epoch == 2 for pid in ids)
    assert store.reports.count_events("pipeline_recovered") == len(ids)


def test_eight_reclaimer_threads_race_and_each_orphan_is_reclaimed_once(store):
    ids = seed_orphans(store)
    results: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def reclaimer(slot: int) -> None:
        barrier.wait()
        while True:
            reclaimed, _ = reclaim(store, PassPlan(limit=7, grace_seconds=600, launching=True))
            if not reclaimed:
                return
            results[slot].extend(r.pipeline_id for r in reclaimed)
            # Between passes a sensor launches the runs it reclaimed, outside the transaction. Without
            # that pause one SQLite thread re-takes the write lock before the others' busy handlers
            # wake, and wins every batch: correct, but no longer a race.
            time.sleep(0.005)

    threads = [threading.Thread(target=reclaimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert_each_once(ids, results, store)
    assert sum(1 for r in results if r) >= 2, "the race should be shared by several reclaimers"


def race_in_processes(target, db_url, count):
    """Start ``count`` spawned processes together and collect what each reports."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    barrier = ctx.Barrier(count)  # all start racing at the same moment
    procs = [ctx.Process(target=target, args=(db_url, f"p{i}", barrier, out)) for i in range(count)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120)[1] for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results


def test_eight_reclaimer_processes_race_and_each_orphan_is_reclaimed_once(store, db_url):
    from workers import reclaim_all

    ids = seed_orphans(store)
    assert_each_once(ids, race_in_processes(reclaim_all, db_url, 8), store)


def test_four_processes_claiming_one_queue_never_share_an_item(store, db_url):
    from workers import claim_all

    ids = set(store.queue.enqueue("q", [{"n": i} for i in range(120)]))
    results = race_in_processes(claim_all, db_url, 4)
    claimed = Counter(i for r in results for i in r)
    assert set(claimed) == ids and max(claimed.values()) == 1
    items = store.queue.list_items("q")
    assert {i.status for i in items} == {"completed"} and {i.attempts for i in items} == {1}


def test_a_pulsing_watchdog_is_never_an_orphan(store):
    # a pulse every 0.5 s against a 3 s timeout: only a pulse thread stalled for 2.5 s (not a busy machine's
    # scheduling) could let the deadline pass
    own = store.pipelines.create_pipeline("job", ["a"], owner="live", origin_run_id="live",
                                limits=PipelineLimits(heartbeat_timeout=3.0))
    store.pipelines.start_node(own, "a", heartbeat_timeout=3.0)
    settings = HeartbeatSettings(interval=0.5, timeout=3.0)
    with Watchdog(store_pulse(store, own, "a", settings.timeout), settings) as dog:
        deadline = time.monotonic() + 6.0  # two full timeouts
        while time.monotonic() < deadline:
            assert store.recovery.find_orphans() == []
            time.sleep(0.1)
        assert dog.pulses >= 5 and dog.lost is None


def test_kill_9_of_a_watchdog_process_makes_an_orphan_within_timeout_plus_one_scan(store, db_url):
    # slack for a busy 2-core machine: the child pulses every 0.5 s against a 3 s timeout, and the orphan may be
    # found up to 2 s after the deadline (the scan's own query and sleep)
    timeout, interval, slack = 3.0, 0.5, 2.0
    own = store.pipelines.create_pipeline("job", ["work"], owner="child", origin_run_id="child",
                                limits=PipelineLimits(heartbeat_timeout=timeout))
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "support" / "workers.py"),
            db_url,
            str(own.pipeline_id),
            str(own.epoch),
            "child",
            str(interval),
            str(timeout),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(timeout * 1.5)  # alive for longer than one timeout: the watchdog keeps it live
        assert store.recovery.find_orphans() == []
        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        child.wait(10)
        scan_interval = 0.25
        while not store.recovery.find_orphans():
            assert time.monotonic() - killed_at < timeout + scan_interval + slack, "orphan not detected in time"
            time.sleep(scan_interval)
        detected = time.monotonic() - killed_at
        assert detected <= timeout + scan_interval + slack
        (orphan,) = store.recovery.find_orphans()
        assert orphan.id == own.pipeline_id and orphan.reason == "heartbeat"
    finally:
        if child.poll() is None:
            child.kill()


def test_watchdog_stops_the_node_when_ownership_is_lost(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="old", origin_run_id="old")
    store.pipelines.start_node(own, "a")
    settings = HeartbeatSettings(interval=0.1, timeout=0.5)
    lost = threading.Event()
    dog = Watchdog(store_pulse(store, own, "a", settings.timeout), settings, on_lost=lambda exc: lost.set())
    with dog:
        # the live watchdog pushes the deadline forward every 0.1 s: its pulse can land between the expiry
        # and the pass, which then rightly finds no orphan, so each pass expires it again
        reclaimed = reclaim_until_taken(store, PassPlan(limit=5, launching=True),
                                        before=lambda: expire(store, own.pipeline_id))
        assert [r.pipeline_id for r in reclaimed] == [own.pipeline_id]
        assert lost.wait(5)
    assert dog.lost is not None and "resume-" in str(dog.lost)
    with pytest.raises(Exception):  # noqa: B017 - whatever the lost lease raised, check() raises it again
        dog.check()


def test_watchdog_survives_database_errors_and_rechecks_ownership_after_a_long_gap(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="w", origin_run_id="w")
    store.pipelines.start_node(own, "a")
    calls = {"pulse": 0, "verify": 0}
    real = store_pulse(store, own, "a", 1.0)

    def flaky_pulse():
        calls["pulse"] += 1
        if calls["pulse"] <= 6:
            raise ConnectionResetError(104, "connection reset by peer")
        real()

    def verify():
        calls["verify"] += 1
        pipeline = store.pipelines.get_pipeline(own.pipeline_id)
        assert (pipeline.owner, pipeline.epoch) == (own.owner, own.epoch)

    settings = HeartbeatSettings(interval=0.1, timeout=0.2)
    with Watchdog(flaky_pulse, settings, verify=verify) as dog:
        wait_for(lambda: dog.pulses >= 2, timeout=10, interval=0.02, what="two good pulses")
    assert dog.failures == 6 and dog.pulses >= 2 and dog.lost is None
    assert calls["verify"] >= 1
