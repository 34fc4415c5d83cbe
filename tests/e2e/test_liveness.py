"""Run-level liveness under a real `dagster dev` (daemon, sensors, code server) with a CPU hog per core.

Heartbeat 2 s / timeout 8 s and a sensor every second, so a healthy run that ever looks dead
for one timeout is reclaimed within seconds, and the test sees it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from sqlalchemy import func, select, text

from databases import pg_database
from pipeline_history import history
from recovery_pipelines.devserver import parent_of, wait_for
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.schema import events, node_items, transitions

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Heartbeat 2 s / timeout 8 s (issue 8's tight setting; the default is 30 s / 90 s). With 1 s / 3 s,
# scheduling gaps of 4-5 s were measured on a machine loaded far beyond its cores (load average 20+
# on 2 cores), which is a setting problem, not a liveness one. RX_LIVENESS_TIMEOUT overrides it.
TIMEOUT = float(os.environ.get("RX_LIVENESS_TIMEOUT", "8"))
HEALTHY_RUNS = 4  # 2 of each executor; their 8 pooled ops take one slot one after another
# of the timeout, for test_g's pooled ops (before: 8 runs at a quarter each, the same chain of waits, 80 s more).
# The waits test_g asserts are the two multiprocess runs': their 4 pooled ops queue together (the in-process runs'
# come after the 3-timeout plain op), each holding the slot for its step process's start and half the timeout. The
# last of the 4 waits for 3 such holds less the gap between the two runs' `prepare` ends: past the timeout unless
# that gap nears a timeout (on 2 cores a run's second pooled op even asks only once its first is done).
POOL_HOLD = 0.5
# PostgreSQL storage, as production runs Dagster: on SQLite, Dagster claims a pool slot with a SELECT
# then an UPDATE (FOR UPDATE SKIP LOCKED is a no-op there), so two steps of a limit-1 pool can
# occasionally run at once, which test_g would see.
INSTANCE_YAML = """\
telemetry:
  enabled: false
storage:
  postgres:
    postgres_url: {dagster_url}
concurrency:
  pools:
    granularity: op
    default_limit: 1
  runs:
    max_concurrent_runs: 6
run_retries:
  enabled: true
"""


@pytest.fixture(scope="module")
def fail_flag(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("flags") / "fail-once"


@pytest.fixture(scope="module")
def dagster_url(pg_admin) -> Iterator[str]:
    with pg_database(pg_admin) as url:
        yield url.replace("postgresql://", "postgresql+psycopg2://")  # dagster-postgres runs on psycopg2


DEFS = "liveness_defs.py"


def dagster_yaml(request) -> str:
    return INSTANCE_YAML.format(dagster_url=request.getfixturevalue("dagster_url"))


def dev_env(request) -> dict[str, str]:
    return {"LIVENESS_HEARTBEAT_INTERVAL": str(max(1.0, TIMEOUT / 4)), "LIVENESS_HEARTBEAT_TIMEOUT": str(TIMEOUT),
            "LIVENESS_SENSOR_INTERVAL": "1", "LIVENESS_FAIL_FLAG": str(request.getfixturevalue("fail_flag"))}


def trace_rows(store, run_id=None, node=None):
    query = "SELECT run_id, node, item, started, ended, pid FROM liveness_trace WHERE 1=1"
    params = {}
    if run_id:
        query, params["run_id"] = query + " AND run_id = :run_id", run_id
    if node:
        query, params["node"] = query + " AND node = :node", node
    with store.engine.connect() as conn:
        try:
            return conn.execute(text(query + " ORDER BY id"), params).all()
        except Exception:  # noqa: BLE001 - the table appears with the first record
            return []


def reclaims(store, pipeline_ids=None) -> int:
    query = select(func.count()).select_from(transitions).where(transitions.c.event == "reclaimed")
    if pipeline_ids is not None:
        query = query.where(transitions.c.pipeline_id.in_(pipeline_ids))
    with store.read() as conn:
        return conn.scalar(query)


def resume_runs(dev):
    return [r for r in dev.runs() if TAG_RESUME_NUMBER in r.tags]


SENSOR_TICKS = """
query Ticks($location: String!) {
  sensorOrError(sensorSelector: {repositoryLocationName: $location, repositoryName: "__repository__",
                                 sensorName: "recovery_orphan_sensor"}) {
    ... on Sensor { sensorState { ticks(limit: 50) { timestamp status } } }
  }
}
"""


def sensor_ticks_since(dev, since: float) -> int:
    """Completed orphan-sensor ticks after ``since`` (an idle tick records nothing in the store)."""
    data = dev.client._execute(SENSOR_TICKS, {"location": dev.location})
    ticks = data["sensorOrError"]["sensorState"]["ticks"]
    return sum(1 for t in ticks if t["timestamp"] > since and t["status"] in ("SKIPPED", "SUCCESS"))


def test_b_a_conditional_branch_not_taken_is_skipped_and_the_pipeline_completes(dev, store):
    run_id = dev.launch("branch_job", {})
    dev.wait_run(run_id, timeout=300)
    pipeline = wait_for(
        lambda: (p := store.pipelines.find_pipeline(run_id)) and p.status == "completed" and p,
        timeout=60,
        what="the branch pipeline to complete",
    )
    assert {n.name: n.status for n in store.pipelines.list_nodes(pipeline.id)} == {"left_branch": "completed",
                                                                         "right_branch": "skipped"}
    with store.read() as conn:
        skipped = conn.execute(select(transitions.c.from_status, transitions.c.event).where(
            transitions.c.pipeline_id == pipeline.id, transitions.c.to_status == "skipped")).all()
    assert [tuple(r) for r in skipped] == [("pending", "skipped")]
    assert reclaims(store) == 0


def test_c_a_users_cancel_cancels_the_pipeline_and_it_is_never_resumed(dev, store):
    run_id = dev.launch("items_job", {"ops": {"work": {"config": {"item_seconds": 2.0}}}})
    wait_for(lambda: trace_rows(store, run_id, "work"), timeout=300, what="work to be mid-way")
    dev.client.terminate_run(run_id)
    dev.wait_run(run_id, statuses=(DagsterRunStatus.CANCELED,), timeout=120)
    pipeline = wait_for(lambda: (p := store.pipelines.find_pipeline(run_id)).status == "canceled" and p, timeout=60,
                        what="the pipeline to be canceled")
    canceled_at = time.time()
    wait_for(lambda: sensor_ticks_since(dev, canceled_at) >= 3, timeout=120, what="three more sensor ticks")
    assert store.pipelines.get_pipeline(pipeline.id).status == "canceled"
    assert [r for r in resume_runs(dev) if r.tags.get(TAG_PIPELINE) == str(pipeline.id)] == []
    with store.read() as conn:
        moves = conn.execute(select(transitions.c.to_status, transitions.c.event).where(
            transitions.c.pipeline_id == pipeline.id, transitions.c.entity_type == "pipeline")
            .order_by(transitions.c.id)).all()
    assert [tuple(m) for m in moves] == [("running", "created"), ("canceled", "canceled")]
    assert len(trace_rows(store, run_id, "work")) < 8


REEXECUTE = """
mutation Reexecute($parentRunId: String!) {
  launchPipelineReexecution(reexecutionParams: {parentRunId: $parentRunId, strategy: FROM_FAILURE}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""


def test_d_a_ui_reexecution_from_failure_takes_the_same_pipeline_over_and_redoes_only_unfinished_items(
        dev, store, fail_flag):
    fail_flag.write_text("fail once")
    first = dev.launch("items_job", {})
    dev.wait_run(first, statuses=(DagsterRunStatus.FAILURE,), timeout=300)
    pipeline = wait_for(lambda: (p := store.pipelines.find_pipeline(first)).status == "failed" and p, timeout=60,
                        what="the pipeline to fail with the step's error")
    assert "bad input at work-3" in (pipeline.error or "")
    assert [r.item for r in trace_rows(store, first, "work")] == ["work-0", "work-1", "work-2"]

    answer = dev.client._execute(REEXECUTE, {"parentRunId": first})["launchPipelineReexecution"]
    assert answer["__typename"] == "LaunchRunSuccess", answer
    second = answer["run"]["runId"]
    dev.wait_run(second, timeout=300)
    after = store.pipelines.get_pipeline(pipeline.id)
    assert (after.status, after.owner, after.epoch) == ("completed", second, pipeline.epoch + 1)
    assert store.pipelines.find_pipeline(second) is None  # no second pipeline row for the same logical run
    assert [r.item for r in trace_rows(store, second, "work")] == [f"work-{i}" for i in range(3, 8)]
    done = [r.item for run in (first, second) for r in trace_rows(store, run, "work")]
    assert sorted(done) == [f"work-{i}" for i in range(8)]  # every item done exactly once across both runs
    assert {n.name: n.status for n in store.pipelines.list_nodes(pipeline.id)} == {"work": "completed",
                                                                         "after_work": "completed"}
    with store.read() as conn:
        taken = conn.execute(select(transitions.c.from_status, transitions.c.data).where(
            transitions.c.pipeline_id == pipeline.id, transitions.c.event == "taken_over")).all()
    assert len(taken) == 1 and taken[0].from_status == "failed" and taken[0].data["previous_owner"] == first
    assert resume_runs(dev) == [] and reclaims(store) == 0


def test_e_a_step_process_killed_while_its_run_worker_lives_is_reported_dead_by_it_and_no_live_sibling_is_reset(
        dev, store):
    run_id = dev.launch("healthy_job", {})
    (victim,) = wait_for(lambda: [r for r in trace_rows(store, run_id) if r.item == "start"][:1], timeout=300,
                         what="a pooled step to start")
    sibling = "pooled_b" if victim.node == "pooled_a" else "pooled_a"
    killed = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    pipeline = store.pipelines.find_pipeline(run_id)
    died = wait_for(lambda: store.pipelines.get_node(pipeline.id, victim.node).died_at, timeout=120, interval=0.05,
                    what="the run worker to report the killed step dead")
    print(f"\nstep {victim.node} killed; reported dead by its run worker after {died.timestamp() - killed:.2f} s "
          f"(node heartbeat timeout {TIMEOUT:g} s)")
    try:
        wait_for(lambda: store.pipelines.get_pipeline(pipeline.id).status == "completed", timeout=400,
                 what="the resumed pipeline to complete")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {history(dev, store, pipeline.id)}") from exc
    with store.read() as conn:
        ((payload, reclaimed_at),) = conn.execute(select(events.c.payload, events.c.created_at).where(
            events.c.pipeline_id == pipeline.id, events.c.kind == "pipeline_recovered")).all()
    print(f"reclaimed {reclaimed_at.timestamp() - killed:.2f} s after the kill, once its run worker let go")
    # reported dead by the run worker while it was still running the plain op; the sibling in the pool,
    # if it started in the first run, was alive: the reclaim waited for it, so it was never reset
    assert payload["cause"] == "node_died" and payload["reset_nodes"] == [victim.node]
    resumes = [r for r in resume_runs(dev) if r.tags.get(TAG_PIPELINE) == str(pipeline.id)]
    assert len(resumes) == 1
    assert [r.item for r in trace_rows(store, resumes[0].run_id, "prepare")] == []  # completed work not redone
    sibling_work = [r.item for run in (run_id, resumes[0].run_id) for r in trace_rows(store, run, sibling)]
    assert sibling_work == ["start", "slot"]  # done once, in whichever run started it


def test_f_a_dagster_run_retry_after_a_crash_takes_the_pipeline_over_and_the_sensor_stands_aside(dev, store):
    run_id = dev.launch("items_job", {"ops": {"work": {"config": {"item_seconds": 1.0}}}},
                        tags={"dagster/max_retries": "1"})
    rows = wait_for(lambda: len(trace_rows(store, run_id, "work")) >= 2 and trace_rows(store, run_id, "work"),
                    timeout=300, what="work to be mid-way")
    os.kill(parent_of(rows[0].pid), signal.SIGKILL)  # the run worker; Dagster retries the run
    pipeline = store.pipelines.find_pipeline(run_id)
    try:
        retry = wait_for(lambda: [r for r in dev.runs(tags={"dagster/parent_run_id": run_id})][:1], timeout=180,
                         what="Dagster's retry run")[0]
        dev.wait_run(retry.run_id, timeout=300)
    except AssertionError as exc:  # say who took the pipeline over instead
        with store.read() as conn:
            history = conn.execute(select(transitions.c.event, transitions.c.data).where(
                transitions.c.pipeline_id == pipeline.id, transitions.c.entity_type == "pipeline")).all()
        raise AssertionError(f"{exc}; old run {dev.run(run_id).status.value}, "
                             f"pipeline history {[(h.event, h.data) for h in history]}") from exc
    after = wait_for(lambda: (p := store.pipelines.get_pipeline(pipeline.id)).status == "completed" and p, timeout=60,
                     what="the pipeline to complete")
    assert after.owner == retry.run_id and after.resume_count == 0
    assert [r for r in resume_runs(dev) if r.tags.get(TAG_PIPELINE) == str(pipeline.id)] == []
    with store.read() as conn:
        taken = conn.execute(select(transitions.c.data).where(
            transitions.c.pipeline_id == pipeline.id, transitions.c.event == "taken_over")).scalars().all()
        reclaimed = conn.execute(select(func.count()).select_from(transitions).where(
            transitions.c.pipeline_id == pipeline.id, transitions.c.event == "reclaimed")).scalar()
    assert len(taken) == 1 and taken[0]["previous_owner"] == run_id and reclaimed == 0
    with store.read() as conn:
        by_run = dict(conn.execute(select(node_items.c.item_key, node_items.c.run_id).where(
            node_items.c.pipeline_id == pipeline.id, node_items.c.node_name == "work")).all())
    assert sorted(by_run) == [f"work-{i}" for i in range(8)] and set(by_run.values()) <= {run_id, retry.run_id}
    # the killed run's step process may finish items until the retry takes over; none is done twice
    redone = {r.item for r in trace_rows(store, retry.run_id, "work")}
    assert not redone & {k for k, rid in by_run.items() if rid == run_id}
    assert redone == {k for k, rid in by_run.items() if rid == retry.run_id}


@pytest.mark.timeout(3600)
def test_g_healthy_runs_with_plain_ops_retry_delays_and_pool_waits_are_never_reclaimed(dev, store):
    jobs = ["healthy_job"] * (HEALTHY_RUNS // 2) + ["healthy_job_inprocess"] * (HEALTHY_RUNS // 2)
    # each pooled op holds the slot half the timeout (it runs after its step process starts, which
    # holds the slot too); with 4 runs queued on the slot, the waits still span the timeout, see below
    pooled = {"ops": {name: {"config": {"hold_fraction": POOL_HOLD}} for name in ("pooled_a", "pooled_b")}}
    run_ids = [dev.launch(job, pooled) for job in jobs]
    done = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
    for run_id in run_ids:
        dev.wait_run(run_id, statuses=done, timeout=2400)  # generous: the shared machine may be very busy
    statuses = [dev.run(r).status for r in run_ids]
    assert statuses == [DagsterRunStatus.SUCCESS] * HEALTHY_RUNS, [  # say what happened to a run that did not succeed
        (run_id, status.value, (p := store.pipelines.find_pipeline(run_id)) and history(dev, store, p.id))
        for run_id, status in zip(run_ids, statuses, strict=True) if status != DagsterRunStatus.SUCCESS]
    pipelines = [store.pipelines.find_pipeline(run_id) for run_id in run_ids]
    assert reclaims(store, [p.id for p in pipelines]) == 0
    assert [r for r in resume_runs(dev) if r.tags.get(TAG_PIPELINE) in {str(p.id) for p in pipelines}] == []
    for run_id in run_ids:
        pipeline = store.pipelines.find_pipeline(run_id)
        assert (pipeline.status, pipeline.resume_count, pipeline.epoch) == ("completed", 0, 1)
        attempts = trace_rows(store, run_id, "finish")
        assert [r.item for r in attempts] == ["attempt-0", "attempt-1"]
        assert attempts[1].started - attempts[0].started >= TIMEOUT  # the retry waited longer than the timeout
        assert dev.run(run_id).tags[TAG_PIPELINE] == str(pipeline.id)
    # the pool (limit 1) was enforced across all runs, and ops waited for it longer than the timeout
    slots = sorted((r.started, r.ended) for run_id in run_ids for r in trace_rows(store, run_id) if r.item == "slot")
    assert len(slots) == 2 * HEALTHY_RUNS
    assert all(later[0] >= earlier[1] - 0.05 for earlier, later in zip(slots, slots[1:], strict=False))
    waits = []
    # parallel steps: a real wait
    for run_id in [r for r, job in zip(run_ids, jobs, strict=False) if job == "healthy_job"]:
        ready = max(r.ended for r in trace_rows(store, run_id, "prepare"))
        waits += [r.started - ready for r in trace_rows(store, run_id) if r.item == "slot"]
    assert max(waits) > TIMEOUT
