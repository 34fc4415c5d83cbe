"""End-to-end crash recovery under a real `dagster dev` (daemon, code server, webserver) with kill -9.

Two orphan sensors run side by side in this code location, so every case also checks that
racing sensors launch exactly one resume run per orphan.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from dagster import DagsterEventType, DagsterRunStatus
from sqlalchemy import select, text

from pipeline_history import history
from recovery_pipelines.devserver import cmdline, parent_of, process_alive, wait_for
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext import scan
from recovery_ext._store.models import PassPlan
from recovery_ext._store.schema import events, node_items, transitions

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = ("n1", "n2", "n3", "n4")
MAX_RESUMES = 2


DEFS = "e2e_defs.py"


def dev_env(request) -> dict[str, str]:
    # Short enough that a kill is found in seconds, long enough that a healthy worker on CI's busiest minutes
    # (three runs starting at once beside test_liveness's eight) keeps its pipeline: a heartbeat timeout of 5 s
    # (a pulse each second) and a stall timeout of 8 s (test_e's items take 1 s each). With 3 s and 4 s, one CI
    # run saw a run of test_e never reach n2 (why was not recorded; wait_working now says what became of it).
    return {"E2E_TWO_SENSORS": "1", "E2E_MAX_RESUMES": str(MAX_RESUMES), "E2E_HEARTBEAT_INTERVAL": "1",
            "E2E_HEARTBEAT_TIMEOUT": "5", "E2E_STALL_TIMEOUT": "8", "E2E_SENSOR_INTERVAL": "1"}


def config(items=6, item_seconds=0.4, **node_overrides):
    cfg = {"ops": {n: {"config": {"items": items, "item_seconds": item_seconds}} for n in NODES}}
    for node, values in node_overrides.items():
        cfg["ops"][node]["config"].update(values)
    return cfg


def calls(store, run_id=None, node=None):
    query = "SELECT run_id, node, item, pid, ppid FROM e2e_calls WHERE 1=1"
    params = {}
    if run_id:
        query += " AND run_id = :run_id"
        params["run_id"] = run_id
    if node:
        query += " AND node = :node"
        params["node"] = node
    with store.engine.connect() as conn:
        try:
            return conn.execute(text(query + " ORDER BY id"), params).all()
        except Exception:  # noqa: BLE001 - the table appears with the first call
            return []


def pipeline_of(store, run_id):
    return wait_for(lambda: store.pipelines.find_pipeline(run_id), timeout=60, what=f"the pipeline of run {run_id}")


def resume_runs(dev, pipeline_id):
    runs = [r for r in dev.runs(tags={TAG_PIPELINE: str(pipeline_id)}) if TAG_RESUME_NUMBER in r.tags]
    return sorted(runs, key=lambda r: int(r.tags[TAG_RESUME_NUMBER]))  # the first run carries the pipeline tag too


def wait_working(dev, store, run_id, node, *, timeout):
    """The calls run ``run_id`` made in ``node``, once it made one; a timeout says what became of the run and its
    pipeline (a run that never gets there was stopped, reclaimed or never started: each is a different bug)."""
    try:
        return wait_for(lambda: calls(store, run_id, node), timeout=timeout, what=f"run {run_id} to work in {node}")
    except AssertionError as timed_out:
        run = dev.run(run_id)
        found = store.pipelines.find_pipeline(run_id)
        raise AssertionError(f"{timed_out}; the run is {run.status.value if run else 'unknown'} "
                             f"({dev.why_ended(run_id)}); "
                             + (history(dev, store, found.id) if found else "it has no pipeline")) from None


def wait_completed(dev, store, pipeline_id, timeout=150):
    """Poll until the pipeline completes; a timeout says what became of it (its moves, nodes and runs)."""
    try:
        return wait_for(lambda: store.pipelines.get_pipeline(pipeline_id).status == "completed", timeout=timeout,
                        what=f"pipeline {pipeline_id} to complete")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; {history(dev, store, pipeline_id)}") from None


def items_by(store, pipeline_id, node):
    with store.read() as conn:
        return {r.item_key: (r.run_id, r.epoch) for r in conn.execute(
            select(node_items).where(node_items.c.pipeline_id == pipeline_id, node_items.c.node_name == node))}


def reclaimed_at(store, pipeline_id):
    with store.read() as conn:
        return conn.execute(select(transitions.c.id).where(transitions.c.pipeline_id == pipeline_id,
                                                           transitions.c.event == "reclaimed")).scalars().all()


def assert_exactly_one_resume(dev, store, pipeline_id, expected=1):
    runs = resume_runs(dev, pipeline_id)
    assert [int(r.tags[TAG_RESUME_NUMBER]) for r in runs] == list(range(1, expected + 1)), history(dev, store,
                                                                                                  pipeline_id)
    assert store.pipelines.get_pipeline(pipeline_id).resume_count == expected
    return runs


def assert_points_forward(dev, dead_run_id, resume_run_id, *, cause):
    """The dead run names the run that took over and why, as the resume names the dead run."""
    old = wait_for(lambda: (r := dev.run(dead_run_id)).tags.get("recovery/superseded_by") and r, timeout=30,
                   what="the superseded run to point to its resume run")
    assert old.tags["recovery/superseded_by"] == resume_run_id
    assert old.tags["recovery/superseded_cause"].startswith(cause)
    assert any(f"superseded by run {resume_run_id}" in (e.message or "") for e in dev.instance.all_logs(dead_run_id))


def test_a_kill_9_of_the_run_worker_mid_node_resumes_and_fences_the_orphaned_step(dev, store):
    run_id = dev.launch("items_job", config(n2={"item_seconds": 1.5}))
    first_n2 = wait_for(lambda: len(calls(store, run_id, "n2")) >= 2 and calls(store, run_id, "n2"), timeout=90,
                        what="n2 to be mid-way")
    step_pid, run_worker = first_n2[0].pid, first_n2[0].ppid
    assert "spawn_main" in cmdline(step_pid)
    done_before_kill = set(items_by(store, pipeline_of(store, run_id).id, "n2"))
    os.kill(run_worker, signal.SIGKILL)
    pipeline = pipeline_of(store, run_id)
    wait_completed(dev, store, pipeline.id)
    (resume,) = assert_exactly_one_resume(dev, store, pipeline.id)
    dev.wait_run(resume.run_id)
    assert resume.tags[TAG_RESUMED_FROM] == run_id
    assert dev.run(run_id).status == DagsterRunStatus.FAILURE
    assert_points_forward(dev, run_id, resume.run_id, cause="owner_run_dead")
    # completed nodes were not called again
    assert {c.run_id for c in calls(store, node="n1")} >= {run_id}
    assert len(calls(store, resume.run_id, "n1")) == 0 and len(calls(store, run_id, "n1")) == 6
    # ... nor given a step process: the resume's run worker replayed n1 (integration/replay.py)
    workers = {r.dagster_event.step_key for r in dev.instance.all_logs(resume.run_id,
                                                                       of_type=DagsterEventType.STEP_WORKER_STARTING)}
    assert workers == {"n2", "n3", "n4"}
    # n2 is done exactly once per item; the resume re-did only what the first run had not finished
    done = items_by(store, pipeline.id, "n2")
    assert sorted(done) == [f"n2-{i}" for i in range(6)]
    redone = {c.item for c in calls(store, resume.run_id, "n2")}
    assert redone and not (redone & done_before_kill)
    assert all(epoch == 1 for key, (rid, epoch) in done.items() if rid == run_id)
    # the orphaned step process outlived its run worker, then stopped once its writes were refused
    wait_for(lambda: not process_alive(step_pid), timeout=60, what="the superseded step process to stop")
    assert all(rid == resume.run_id for rid, _ in items_by(store, pipeline.id, "n3").values())


def test_b_host_loss_marks_the_dead_run_failed_and_resumes(dev, store):
    run_id = dev.launch("items_job", config())
    rows = wait_for(lambda: len(calls(store, run_id, "n2")) >= 1 and calls(store, run_id, "n2"), timeout=90,
                    what="n2 to start")
    step_pid, run_worker = rows[0].pid, rows[0].ppid
    grpc_server = parent_of(run_worker)
    proxy = parent_of(grpc_server)
    victims = [step_pid, run_worker, grpc_server] + ([proxy] if "code-server" in cmdline(proxy) else [])
    assert "dagster api grpc" in cmdline(grpc_server)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    assert dev.run(run_id).status == DagsterRunStatus.STARTED  # stock Dagster does not notice
    dev.reload()
    pipeline = pipeline_of(store, run_id)
    wait_completed(dev, store, pipeline.id, timeout=180)
    (resume,) = assert_exactly_one_resume(dev, store, pipeline.id)
    old = wait_for(lambda: (r := dev.run(run_id)).status == DagsterRunStatus.FAILURE and r, timeout=30,
                   what="the dead run to be marked failed")
    messages = [e.message for e in dev.instance.all_logs(old.run_id)]
    assert any("stopped heartbeating" in (m or "") for m in messages)
    dev.wait_run(resume.run_id)
    assert_points_forward(dev, run_id, resume.run_id, cause="heartbeat")


def test_c_sigstop_of_the_run_worker_is_detected_and_its_writes_refused_after_sigcont(dev, store):
    run_id = dev.launch("items_job_inprocess", config())
    rows = wait_for(lambda: len(calls(store, run_id, "n2")) >= 2 and calls(store, run_id, "n2"), timeout=90,
                    what="n2 to be mid-way")
    worker = rows[0].pid
    os.kill(worker, signal.SIGSTOP)
    try:
        pipeline = pipeline_of(store, run_id)
        wait_completed(dev, store, pipeline.id)
        (resume,) = assert_exactly_one_resume(dev, store, pipeline.id)
        dev.wait_run(resume.run_id)
        assert dev.run(run_id).status == DagsterRunStatus.FAILURE
        before = {k: v for k, v in items_by(store, pipeline.id, "n2").items()}
    finally:
        os.kill(worker, signal.SIGCONT)
    # the old worker wakes up, finds its next write refused, fails its step and exits
    wait_for(lambda: not process_alive(worker), timeout=60, what="the superseded run worker to stop")
    assert items_by(store, pipeline.id, "n2") == before
    assert store.pipelines.get_pipeline(pipeline.id).owner == resume.run_id
    assert all(rid == resume.run_id for rid, _ in items_by(store, pipeline.id, "n3").values())


def test_d_a_stalled_node_with_a_live_watchdog_is_detected_and_resumed(dev, store):
    run_id = dev.launch("items_job_inprocess", config(n2={"stall_at": 2}))
    pipeline = pipeline_of(store, run_id)
    wait_completed(dev, store, pipeline.id)
    (resume,) = assert_exactly_one_resume(dev, store, pipeline.id)
    with store.read() as conn:
        payload = conn.execute(select(events.c.payload).where(events.c.pipeline_id == pipeline.id,
                                                              events.c.kind == "pipeline_recovered")).scalar_one()
    assert payload["cause"] == "stalled"
    # The tick asks the launcher to terminate the stalled run, then marks it FAILURE if Dagster still shows it live.
    # Dagster's terminate is asynchronous: a worker that acknowledges the cancel first ends CANCELED (seen once in
    # CI under load). Either way it ended, stopped by the take-over, and names the run that took over.
    old = dev.wait_run(run_id, statuses=(DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED), timeout=60)
    assert old.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
    assert old.tags.get("recovery/superseded_by") == resume.run_id
    assert {c.item for c in calls(store, resume.run_id, "n2")} == {"n2-2", "n2-3", "n2-4", "n2-5"}


def test_e_racing_sensors_and_the_cli_scan_launch_exactly_one_resume_per_orphan(dev, store):
    # slow items: under load a run must still be mid-n2 when its worker is killed
    run_ids = [dev.launch("items_job_inprocess", config(item_seconds=1.0)) for _ in range(3)]
    stop = threading.Event()

    def cli_scans():
        while not stop.wait(0.05):
            scan(store, PassPlan(trigger="cli"))

    racer = threading.Thread(target=cli_scans)
    racer.start()
    try:
        for run_id in run_ids:  # each worker is killed as soon as its n2 works, while the CLI scans race
            rows = wait_working(dev, store, run_id, "n2", timeout=180)
            os.kill(rows[0].pid, signal.SIGKILL)
        pipelines = [pipeline_of(store, r) for r in run_ids]
        for p in pipelines:
            wait_completed(dev, store, p.id, timeout=300)
    finally:
        stop.set()
        racer.join(30)
    for p in pipelines:
        assert_exactly_one_resume(dev, store, p.id)
        assert len(reclaimed_at(store, p.id)) == 1


def test_f_a_pipeline_that_keeps_crashing_is_given_up_after_its_maximum_resumes(dev, store):
    run_id = dev.launch("items_job_inprocess", config(item_seconds=0.3))
    pipeline = pipeline_of(store, run_id)
    owner = run_id
    for attempt in range(MAX_RESUMES + 1):
        rows = wait_for(lambda owner=owner: calls(store, owner, "n1"), timeout=120,
                        what=f"run {owner} to start working")
        os.kill(rows[0].pid, signal.SIGKILL)
        if attempt < MAX_RESUMES:
            runs = wait_for(lambda attempt=attempt: len(resume_runs(dev, pipeline.id)) == attempt + 1
                            and resume_runs(dev, pipeline.id),
                            timeout=90, what=f"resume #{attempt + 1}")
            owner = runs[-1].run_id
    failed = wait_for(lambda: (p := store.pipelines.get_pipeline(pipeline.id)).status == "failed" and p, timeout=90,
                      what="the pipeline to be given up")
    assert failed.gave_up_reason == f"gave up after {MAX_RESUMES} resumes (maximum {MAX_RESUMES})"
    assert len(resume_runs(dev, pipeline.id)) == MAX_RESUMES
    with store.read() as conn:
        kinds = conn.execute(select(events.c.kind).where(events.c.pipeline_id == pipeline.id)).scalars().all()
    assert kinds.count("pipeline_recovered") == MAX_RESUMES and "pipeline_stuck" in kinds
    wait_for(lambda: dev.run(owner).status == DagsterRunStatus.FAILURE, timeout=30, what="the last run to fail")
