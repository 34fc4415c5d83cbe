"""The ledger stays exact on Dagster's Celery executor when a step is cut short mid-call.

One deployment for the module (tests/support/celery_cluster.py, a CPU hog per core), plus a
stand-in OpenAI-compatible provider (tests/support/stand_in_llm.py) that counts every request and
the tokens it charges, listening on the bridge address the namespace hosts reach. ``celery_llm_job``
asks it two questions per item through the shipped LLM resource (journaled). A step is cut short
while the provider holds one of its requests (its answer is 2 s away):

- its worker host is cut off past the heartbeat timeout (the pipeline is reclaimed and resumed on
  the other worker host), then reconnected: the old step's late answer is refused by the fence, or
  the old run's revoke ends it;
- its Celery pool process gets SIGTERM (what a revoke with ``terminate=True`` sends): its watcher
  reports it dead, the pipeline is reclaimed and resumed;
- the run host is cut off instead: the step on its healthy worker host goes on calling until the
  take-over, then its late answer is refused by the fence or the run's revoke (once the run host is
  back) ends it.

Afterwards the provider answered twice exactly the calls the ledger shows as in flight at the crash
(in flight, outcome unknown; or answered to the superseded worker, wasted); the ledger's calls and
tokens equal the provider's (less the answers no worker received: those tokens are unknown); the
answers journaled before the crash were replayed, not asked again.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from contextlib import closing

import pytest
from celery_cluster import module_deployment
from sqlalchemy import select, text
from stand_in_llm import StandInProvider
from test_celery_e2e import (HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, SENSOR_INTERVAL, assert_one_resume_that_succeeded,
                             pipeline_of, reclaims, recovered_causes, wait_completed)

from recovery_ext import RecoveryStore
from recovery_ext._store.schema import node_items, provider_calls
from recovery_pipelines.devserver import wait_for
import store_rows

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

QUESTIONS_PER_ITEM = 2   # celery_defs.ask_llm (not imported: its executor reads the broker at import)
ITEMS = 5
CALLS = ITEMS * QUESTIONS_PER_ITEM
LATENCY = 2.0   # seconds the provider takes to answer: the window a cut lands in


@pytest.fixture(scope="module")
def provider():
    stand_in = StandInProvider(latency=LATENCY)
    yield stand_in
    stand_in.stop()


@pytest.fixture(scope="module")
def dep(cpu_hog_module, provider):
    def serve(gateway: str) -> dict[str, str]:
        return {"CELERY_E2E_LLM_URL": provider.start(host=gateway)}

    with module_deployment(HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, SENSOR_INTERVAL, worker_hosts=2,
                           start_servers=serve) as d:
        yield d


@pytest.fixture(scope="module")
def store(dep):
    with closing(RecoveryStore(dep.app_url)) as s:
        yield s


# -- helpers ---------------------------------------------------------------------------------------

def launch_and_catch_a_call(dep, provider, *, last: int = CALLS - 1):
    """Launch the job; return its run id and the request of its step the provider is answering (the
    second question of an item, so the item's first answer is journaled and not checkpointed): a random
    one of requests 2, 4, ... up to ``last``."""
    provider.reset()
    nth = random.Random().choice(range(2, last + 1, QUESTIONS_PER_ITEM))
    run_id = dep.dev.launch("celery_llm_job", {"ops": {"ask_llm": {"config": {"items": ITEMS}}}})
    wait_for(lambda: len(provider.calls) >= nth, timeout=240, interval=0.02, what=f"request {nth} of run {run_id}")
    call = provider.calls[nth - 1]
    assert call in provider.in_progress(), f"the premise failed: request {nth} was answered before the cut"
    print(f"\ncutting the step short while the provider answers request {nth} of {CALLS} ({call.item})")
    return run_id, call


def host_at(dep, address):
    return next(h for h in dep.net.hosts if h.address == address)


def old_step_ended(dep, host, run_id) -> bool:
    """``host``'s Celery worker answers and runs no task of ``run_id`` any more (the task's arguments name
    its run)."""
    name = dep.worker_name(host)
    active = dep.celery_app().control.inspect(destination=[name], timeout=1.0).active() or {}
    return name in active and not any(run_id in repr(task) for task in active[name])


def running(store, pipeline_id) -> bool:
    return store.pipelines.get_pipeline(pipeline_id).status == "running"


def log_size(dep, host) -> int:
    return (dep.logs / f"{host.name}.log").stat().st_size


def how_it_ended(dep, host, since: int) -> list[str]:
    """What ``host``'s Celery worker logged, after byte ``since`` of its log, of a step cut short (a revoke's
    SIGTERM, a refused write, a lost pool process)."""
    with open(dep.logs / f"{host.name}.log", "rb") as f:
        f.seek(since)
        log = f.read().decode(errors="replace")
    return [line.strip()[:160] for line in log.splitlines()
            if any(w in line for w in ("Terminating", "WorkerLostError", "OwnershipLost", "revoked"))]


def step_pid(store, run_id, host):
    """The pool process that ran the step of ``run_id`` on ``host`` (celery_defs records it per item)."""
    with store.engine.connect() as conn:
        return {pid for (pid,) in conn.execute(text(
            "SELECT pid FROM celery_calls WHERE run_id = :run_id AND host = :host"),
            {"run_id": run_id, "host": host.name})}


def ledger_rows(store, pipeline_id):
    pc = provider_calls.c
    with store.read() as conn:
        return conn.execute(select(provider_calls).where(pc.pipeline_id == pipeline_id).order_by(pc.recorded_at)).all()


def checkpointed_by(store, pipeline_id, node="ask_llm"):
    with store.read() as conn:
        return {r.item_key: r.run_id for r in conn.execute(
            select(node_items).where(node_items.c.pipeline_id == pipeline_id, node_items.c.node_name == node))}


def assert_ledger_equals_the_provider(store, provider, pipeline_id, first_run):
    """The ledger against the provider's counts; returns the call answered twice (the one in flight at the
    crash), or None when no call was in flight."""
    paid = provider.answered()
    assert len(paid) == len(provider.calls), "the stand-in refused or failed a request"
    asked = Counter((c.item, c.tokens_in) for c in paid)
    twice = [next(c for c in paid if (c.item, c.tokens_in) == key) for key, n in asked.items() for _ in range(n - 1)]
    rows = ledger_rows(store, pipeline_id)
    f = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    old = [r for r in rows if r.run_id == first_run]
    # in flight at the crash: sent by the superseded step, its answer never kept for a resume
    crash = [r for r in old if not r.reached_checkpoint]
    unknown = [r for r in crash if r.outcome == "in_flight"]
    print(f"provider: {len(paid)} calls, {len(twice)} answered twice; ledger: {f.calls} calls, "
          f"saved {f.saved_calls} (replayed {f.replayed_calls}), wasted {f.wasted_calls}, "
          f"in flight at the crash {f.in_flight_unknown_calls}")
    # every request the provider answered is in the ledger once, for the item it was made for
    assert f.calls == len(rows) == len(paid)
    assert Counter(r.item_key for r in rows) == Counter(c.item for c in paid)
    # answered twice: exactly the call in flight at the crash (a step makes one call at a time), and the
    # ledger shows it so: in flight, outcome unknown, or answered to the superseded step (wasted)
    assert len(twice) <= 1, twice
    assert [r.item_key for r in crash] == [c.item for c in twice]
    assert (f.in_flight_unknown_calls, f.wasted_calls) == (len(unknown), len(crash) - len(unknown))
    # tokens: the provider's, less the answer no worker received (its tokens are unknown to anyone but it)
    lost = twice if unknown else []
    assert (f.tokens_in, f.tokens_out) == (sum(c.tokens_in for c in paid) - sum(c.tokens_in for c in lost),
                                           sum(c.tokens_out for c in paid) - sum(c.tokens_out for c in lost))
    if crash and not unknown:
        assert crash[0].tokens_in == twice[0].tokens_in  # the late answer completed its row
    # the answers of the interrupted item journaled before the crash were replayed by the resume, the
    # provider was not asked again; every other call of the old step reached the old step's checkpoint
    done = checkpointed_by(store, pipeline_id)
    interrupted = {item for item, run in done.items() if run != first_run}
    replayed = [r for r in old if r.reached_checkpoint and r.replays]
    assert all(r.replays == 1 and r.item_key in interrupted for r in replayed)
    assert all(done[r.item_key] == first_run for r in old if r.reached_checkpoint and not r.replays)
    assert not {(r.item_key, r.tokens_in) for r in replayed} & {(c.item, c.tokens_in) for c in twice}
    assert f.replayed_calls == len(replayed) and f.saved_calls == len(old) - len(crash)
    assert sorted(done) == [f"t{i:02d}" for i in range(ITEMS)]
    assert store_rows.call_journal_size(store, pipeline_id) == (0, 0)  # the pipeline completed: pruned
    return twice[0] if twice else None


def assert_cut_call_paid_twice_and_its_item_replayed(store, provider, pipeline_id, first_run, cut_call):
    assert assert_ledger_equals_the_provider(store, provider, pipeline_id, first_run) == cut_call
    f = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    assert f.replayed_calls == 1  # the cut call was an item's second question: the first one's answer
    assert checkpointed_by(store, pipeline_id)[cut_call.item] != first_run


# -- a worker host is cut off mid-call -------------------------------------------------------------

def test_a_worker_host_cut_off_mid_call_leaves_the_ledger_equal_to_the_provider(dep, store, provider):
    run_id, call = launch_and_catch_a_call(dep, provider)
    victim = host_at(dep, call.client)
    logged = log_size(dep, victim)
    victim.cut()
    pipeline = pipeline_of(store, run_id)
    try:
        wait_for(lambda: reclaims(store, pipeline.id), timeout=90, what="the pipeline to be reclaimed")
        assert recovered_causes(store, pipeline.id) == ["node_heartbeat"]
    finally:
        victim.reconnect()
    wait_completed(store, pipeline.id)
    assert_one_resume_that_succeeded(dep, store, pipeline.id, run_id)
    # the old step gets its late answer and finds the fence closed, or its run's revoke ends it
    wait_for(lambda: old_step_ended(dep, victim, run_id), timeout=240, interval=1.0, what="the old step to end")
    print("the old step ended:", *how_it_ended(dep, victim, logged), sep="\n  ")
    assert_cut_call_paid_twice_and_its_item_replayed(store, provider, pipeline.id, run_id, call)


# -- the step's process gets SIGTERM mid-call ------------------------------------------------------

def test_b_a_step_terminated_mid_call_leaves_the_ledger_equal_to_the_provider(dep, store, provider):
    run_id, call = launch_and_catch_a_call(dep, provider)
    victim = host_at(dep, call.client)
    (pid,) = step_pid(store, run_id, victim)
    assert pid in victim.pids()
    os.kill(pid, signal.SIGTERM)   # what a revoke with terminate=True sends the step's pool process
    pipeline = pipeline_of(store, run_id)
    wait_for(lambda: reclaims(store, pipeline.id), timeout=90, what="the pipeline to be reclaimed")
    wait_completed(store, pipeline.id)
    assert_one_resume_that_succeeded(dep, store, pipeline.id, run_id)
    wait_for(lambda: old_step_ended(dep, victim, run_id), timeout=120, interval=1.0, what="the old step to end")
    assert_cut_call_paid_twice_and_its_item_replayed(store, provider, pipeline.id, run_id, call)
    f = store.reports.provider_costs(pipeline.id).pipelines[pipeline.id]
    assert (f.in_flight_unknown_calls, f.wasted_calls) == (1, 0)  # the terminated step never got its answer


# -- the run host is cut off while its step calls on a healthy worker host ---------------------------

def test_c_the_run_host_cut_off_leaves_the_ledger_of_its_step_on_a_healthy_host_equal_to_the_provider(
        dep, store, provider):
    """The step goes on calling until the take-over; its fence or its run's revoke (once the run host is back)
    ends it mid-call or between calls."""
    # The step goes on after the cut and completes the pipeline itself if it finishes its items before the
    # take-over (the run heartbeat's timeout plus a sensor tick, about 10 s): cut it while it has at least
    # 8 more requests (16 s of answers) to make.
    run_id, call = launch_and_catch_a_call(dep, provider, last=CALLS - 8)
    step_host = host_at(dep, call.client)
    logged = log_size(dep, step_host)
    dep.run_host.cut()
    pipeline = pipeline_of(store, run_id)
    try:
        wait_for(lambda: reclaims(store, pipeline.id) or not running(store, pipeline.id), timeout=90,
                 what="the pipeline to be reclaimed")
        assert reclaims(store, pipeline.id), (
            f"the premise failed: the step completed pipeline {pipeline.id} before its take-over")
        assert recovered_causes(store, pipeline.id) == ["heartbeat"]
    finally:
        dep.run_host.reconnect()   # its worker runs the resume run's run worker
    wait_completed(store, pipeline.id)
    assert_one_resume_that_succeeded(dep, store, pipeline.id, run_id)
    wait_for(lambda: old_step_ended(dep, step_host, run_id), timeout=240, interval=1.0, what="the old step to end")
    print("the old step ended:", *how_it_ended(dep, step_host, logged), sep="\n  ")
    assert_ledger_equals_the_provider(store, provider, pipeline.id, run_id)
