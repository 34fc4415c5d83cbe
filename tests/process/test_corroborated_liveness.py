"""Liveness corroborated by the process that knows, on SQLite and PostgreSQL, with real step processes.

Each "step process" here is a real child Python process that starts its node through the store,
as a step of the multiprocess executor does, naming this test process as its watcher. Killing it
with SIGKILL and asking :class:`ProcessWatch` is what a run worker's pulse does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import store_rows
from helpers import reclaim
from sqlalchemy import update

from recovery_ext._liveness.heartbeat import HeartbeatRegistry, HeartbeatSettings
from recovery_ext._processes import WATCHER_ENV, is_alive, process_key, this_process
from recovery_ext._liveness.heartbeat import ProcessWatch
from recovery_ext._store.models import Ownership, PassPlan
from recovery_ext._store.schema import nodes, pipelines

STEP = """
import sys, time
from recovery_ext._store.models import Ownership
from recovery_ext._store.store import RecoveryStore
url, pipeline, epoch, owner, name = sys.argv[1:]
RecoveryStore(url).pipelines.start_node(Ownership(int(pipeline), int(epoch), owner), name, heartbeat_timeout=60)
print("started", flush=True)
time.sleep(600)
"""


@pytest.fixture
def steps() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def start_step(steps, store, own: Ownership, name: str, watcher: str) -> subprocess.Popen:
    """A real step process that starts ``name`` and then lives on (its own heartbeat never pulses again)."""
    env = {**os.environ, WATCHER_ENV: watcher}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            STEP,
            store.url.render_as_string(hide_password=False),
            str(own.pipeline_id),
            str(own.epoch),
            own.owner,
            name,
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    steps.append(proc)
    assert proc.stdout.readline().strip() == "started"
    return proc


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def expire_node_heartbeat(store, own: Ownership, name: str) -> None:
    """The node's last pulse was 65 s ago and its 60 s deadline passed 5 s ago, as when a step process stops
    pulsing: its span stays 60 s, so a watcher vouching meanwhile (for that span) vouches into the future."""
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == name)
                     .values(heartbeat_at=store.dialect.now_plus(-65), heartbeat_deadline=store.dialect.now_plus(-5)))


def make(store, names=("a", "b")) -> Ownership:
    return store.pipelines.create_pipeline("job", list(names), owner="run-1", origin_run_id="run-1", params={})


def test_a_process_key_names_one_process_and_a_reused_pid_or_another_host_never_passes_for_it():
    me = this_process()
    host, pid, start = me.rsplit("/", 2)
    assert int(pid) == os.getpid() and start
    assert is_alive(me) is True
    assert is_alive(f"{host}/{pid}/{int(start) + 1}") is False  # the same pid, another process
    assert is_alive(f"elsewhere/{pid}/{start}") is None           # not this host's to judge
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    key = process_key(child.pid)
    child.wait(10)
    assert is_alive(key) is False


def test_a_node_whose_process_lives_is_vouched_for_and_never_an_orphan_on_its_heartbeat_alone(store, steps):
    own = make(store)
    watcher = this_process()
    start_step(steps, store, own, "a", watcher)
    assert store.pipelines.get_node(own.pipeline_id, "a").watcher == watcher
    report = ProcessWatch(store, watcher).check(5)
    assert report.alive == [f"{own.pipeline_id}/a"] and report.dead == []
    node = store.pipelines.get_node(own.pipeline_id, "a")  # vouched for as long as its own heartbeat span (60 s)
    assert abs((node.vouched_until - node.heartbeat_deadline).total_seconds()) < 20
    expire_node_heartbeat(store, own, "a")  # an overloaded step process missed its own deadline
    assert store.recovery.find_orphans() == []
    assert [(s.pipeline_id, s.name) for s in store_rows.slow_nodes(store)] == [(own.pipeline_id, "a")]
    # once nobody vouches any more (the watcher stopped pulsing), the expired heartbeat decides again
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id)
                     .values(vouched_until=store.dialect.now_plus(-1)))
    assert [o.reason for o in store.recovery.find_orphans()] == ["node_heartbeat"]


def test_a_killed_step_process_is_reported_dead_at_once_and_reclaimed_as_soon_as_its_run_worker_lets_go(
        store, steps):
    own = make(store)
    watcher = this_process()
    step = start_step(steps, store, own, "a", watcher)
    kill(step)
    assert store.recovery.find_orphans() == []  # its own heartbeat has 60 s left: alone, it would wait that long
    report = ProcessWatch(store, watcher).check(60)
    assert report.dead == [f"{own.pipeline_id}/a"]
    assert store.pipelines.get_node(own.pipeline_id, "a").died_at is not None
    # the run worker that reported it is alive and still running the rest of its run: not taken from under it,
    # not even once the dead node's own heartbeat has expired (Dagster frees the pool slots the run holds only
    # when it ends: a run superseded between a slot's claim and its step's start leaks the slot)
    assert store.recovery.find_orphans() == []
    expire_node_heartbeat(store, own, "a")
    assert store.recovery.find_orphans() == []
    assert store.pipelines.leave_to_recovery(own)  # its run ended: the pipeline is an orphan now, not after a timeout
    (orphan,) = store.recovery.find_orphans()
    assert (orphan.id, orphan.reason) == (own.pipeline_id, "node_died")
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert (reclaimed.cause, reclaimed.reset_nodes) == ("node_died", ("a",))
    assert not store.pipelines.leave_to_recovery(own)  # fenced: no longer this run's


def test_a_live_sibling_is_never_reset_for_a_dead_node_the_pipeline_waits_for_it(store, steps):
    own = make(store)
    watcher = this_process()
    start_step(steps, store, own, "a", "gone-host/1/1")  # its host died with its watcher: nobody vouches
    start_step(steps, store, own, "b", watcher)
    ProcessWatch(store, watcher).check(60)
    expire_node_heartbeat(store, own, "a")
    expire_node_heartbeat(store, own, "b")  # the live sibling is late too: overloaded, not dead
    assert store.recovery.find_orphans() == []
    assert reclaim(store, PassPlan(limit=5, launching=True)) == ([], [])
    store.pipelines.complete_node(own, "b", {"done": True})  # the sibling finishes its work under its own epoch
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert (reclaimed.cause, reclaimed.reset_nodes) == ("node_heartbeat", ("a",))
    assert store.pipelines.get_node(own.pipeline_id, "b").status == "completed"


def test_a_watcher_speaks_only_for_its_own_processes_and_only_while_the_run_that_started_them_owns_it(
        store, steps):
    own = make(store)
    other = "some-host/1/1"
    start_step(steps, store, own, "a", other)  # watched by a process on another host
    assert ProcessWatch(store, this_process()).check(60).alive == []
    (node,) = store.pipelines.watched_nodes(other)
    assert store.pipelines.vouch_nodes(this_process(), [node], [], 60) == 0  # not its watcher
    assert store.pipelines.vouch_nodes(other, [replace(node, process="some-host/2/2")], [], 60) == 0  # a stale verdict
    assert store.pipelines.get_node(own.pipeline_id, "a").vouched_until is None
    with store.write() as conn:  # another run owns the pipeline now: the old run's node is not vouched for
        conn.execute(update(pipelines).where(pipelines.c.id == own.pipeline_id).values(owner="run-2"))
    assert store.pipelines.vouch_nodes(other, [node], [node], 60) == 0
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == own.pipeline_id).values(owner="run-1"))
    assert store.pipelines.vouch_nodes(other, [node], [], 60) == 1


def test_a_run_workers_pulse_vouches_for_its_live_steps_and_reports_its_dead_ones(store, steps):
    own = make(store)
    registry = HeartbeatRegistry(store)
    watch = registry.watch_processes()
    try:
        lease = registry.register(own, HeartbeatSettings(interval=30, timeout=60))
        live = start_step(steps, store, own, "a", watch.key)
        dead = start_step(steps, store, own, "b", watch.key)
        kill(dead)
        registry.pulse_once()
        assert store.pipelines.get_node(own.pipeline_id, "a").vouched_until is not None
        assert store.pipelines.get_node(own.pipeline_id, "b").died_at is not None
        assert store.recovery.find_orphans() == []  # its run worker is alive: it ends its run, then lets go
        lease.release()
        kill(live)
        assert store.pipelines.leave_to_recovery(own)
        (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
        assert (reclaimed.cause, sorted(reclaimed.reset_nodes)) == ("node_died", ["a", "b"])
    finally:
        os.environ.pop(WATCHER_ENV, None)


def test_on_celery_the_worker_host_vouches_for_its_pool_process_and_reports_it_dead_when_killed(store, tmp_path):
    from celery import Celery
    from celery_cluster import Redis

    from recovery_pipelines.devserver import wait_for

    redis = Redis()
    redis.start()
    worker = None
    try:
        env = {**os.environ, "RECOVERY_CELERY_BROKER": redis.url_at("127.0.0.1", 0),
               "RECOVERY_CELERY_BACKEND": redis.url_at("127.0.0.1", 1), "RECOVERY_HOST_WATCH_INTERVAL": "0.5",
               "RECOVERY_DATABASE_URL": store.url.render_as_string(hide_password=False)}
        env.pop(WATCHER_ENV, None)
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                [
                    os.path.join(os.path.dirname(sys.executable), "celery"),
                    "-A",
                    "celery_watch_app",
                    "worker",
                    "-Q",
                    "rxtest",
                    "-c",
                    "1",
                    "--without-gossip",
                    "--without-mingle",
                    "-l",
                    "INFO",
                ],
                cwd=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        own = make(store)
        client = Celery(broker=env["RECOVERY_CELERY_BROKER"])
        client.send_task("rx_test.start_node", args=[env["RECOVERY_DATABASE_URL"], own.pipeline_id, own.epoch,
                                                     own.owner, "a"], queue="rxtest")
        node = wait_for(lambda: (n := store.pipelines.get_node(own.pipeline_id, "a")).vouched_until and n, timeout=120,
                        what="the worker host to vouch for its pool process")
        watcher_pid, step_pid = int(node.watcher.split("/")[1]), int(node.process.split("/")[1])
        assert watcher_pid == worker.pid and step_pid != worker.pid  # the main process watches its pool process
        expire_node_heartbeat(store, own, "a")
        assert store.recovery.find_orphans() == []  # vouched for: slow, not dead
        killed = time.monotonic()
        os.kill(step_pid, signal.SIGKILL)
        wait_for(lambda: store.pipelines.get_node(own.pipeline_id, "a").died_at, timeout=60, interval=0.05,
                 what="the worker host to report its pool process dead")
        print(f"\ncelery pool process killed; reported dead after {time.monotonic() - killed:.2f} s")
        assert store.pipelines.leave_to_recovery(
            own
        )  # as the run worker does once dagster-celery reports the step lost
        assert [o.reason for o in store.recovery.find_orphans()] == ["node_died"]
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)
        redis.destroy()


def test_a_node_begun_on_the_hot_path_names_its_process_and_its_watcher(store, monkeypatch):
    monkeypatch.setenv(WATCHER_ENV, "a-host/42/7")
    own = make(store)
    store.pipelines.begin_node(own.owner, "a", heartbeat_timeout=60)
    node = store.pipelines.get_node(own.pipeline_id, "a")
    assert (node.status, node.process, node.watcher) == ("running", this_process(), "a-host/42/7")
