"""Reclaim and launch never come apart, under a real `dagster dev` on a busy machine (issue 8 item 4).

- A tick that fails after its reclaim committed (the daemon times the tick out while the run
  launcher hangs terminating the superseded run) still ends in exactly one resume run: the next
  tick re-requests it under the same run key.
- A resume run held in Dagster's queue far past the launch grace keeps its reservation: still one
  resume run, which attaches once the queue lets it go.
- A resume run its user cancels while it is still queued cancels the pipeline: `canceled`, and no
  other resume run, however many ticks go by.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.scheduler.instigation import TickStatus

from recovery_pipelines.devserver import wait_for
from test_e2e import assert_exactly_one_resume, calls, config, pipeline_of, resume_runs, wait_completed
from test_liveness import sensor_ticks_since

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TESTS = Path(__file__).resolve().parents[1] / "support"
GRACE = 20.0        # longer than a failed tick (TICK_TIMEOUT, and the sensor's 20 s stop budget it keeps running)
TICK_TIMEOUT = 5
HANG = 40.0


@pytest.fixture(scope="module")
def flag(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults") / "hang-terminate.flag"


DEFS = "e2e_defs.py"


def dagster_yaml(request) -> str:
    # One resume run at a time (a blocker can hold the slot); terminate hangs while the flag exists.
    return f"""telemetry:
  enabled: false
run_queue:
  tag_concurrency_limits:
    - key: "recovery/resume_number"
      limit: 1
run_launcher:
  module: e2e_faults
  class: HangingTerminateRunLauncher
  config:
    flag_file: "{request.getfixturevalue('flag')}"
    hang_seconds: {HANG}
"""


def dev_env(request) -> dict[str, str]:
    return {"E2E_HEARTBEAT_INTERVAL": "1", "E2E_HEARTBEAT_TIMEOUT": "4", "E2E_STALL_TIMEOUT": "4",
            "E2E_SENSOR_INTERVAL": "1", "E2E_LAUNCH_GRACE": str(GRACE), "E2E_MAX_RESUMES": "3",
            "DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS": str(TICK_TIMEOUT),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}


def failed_ticks(dev) -> list:
    ticks = []
    for state in dev.instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.name == "recovery_orphan_sensor":
            ticks += [t for t in dev.instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=500)
                      if t.status == TickStatus.FAILURE]
    return ticks


def test_a_tick_that_fails_after_its_reclaim_still_launches_exactly_one_resume_run(dev, store, flag):
    failures_before = len(failed_ticks(dev))
    flag.write_text("hang")
    # n2 stalls while its run worker heartbeats: the sensor reclaims it and asks the launcher to
    # terminate the live run, which hangs past the sensor's gRPC timeout
    run_id = dev.launch("items_job_inprocess", config(item_seconds=0.5, n2={"stall_at": 2}))
    pipeline = pipeline_of(store, run_id)
    wait_for(lambda: not flag.exists(), timeout=120, what="the sensor to reclaim and call terminate")
    wait_for(lambda: len(failed_ticks(dev)) > failures_before, timeout=120,
             what="the daemon to fail the tick that reclaimed (sensor gRPC timeout)")
    assert store.pipelines.get_pipeline(pipeline.id).resume_count == 1
    wait_completed(dev, store, pipeline.id, timeout=300)
    (resume,) = assert_exactly_one_resume(dev, store, pipeline.id)
    dev.wait_run(resume.run_id, timeout=180)
    assert store.pipelines.get_pipeline(pipeline.id).owner == resume.run_id
    # the hung terminate gets through in the end; the superseded run does not stay "running"
    wait_for(lambda: dev.run(run_id).status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED),
             timeout=HANG + 120, what="the superseded run to be stopped")


def hold_the_resume_slot(dev) -> str:
    """A blocker run that holds the only slot for runs tagged recovery/resume_number."""
    blocker = dev.launch("stock_items_job", {"ops": {f"stock_{n}": {"config": {"items": 400, "item_seconds": 0.5}}
                                                     for n in ("n1", "n2", "n3", "n4")}},
                         tags={"recovery/resume_number": "blocker"})
    dev.wait_run(blocker, statuses=(DagsterRunStatus.STARTED,), timeout=180)
    return blocker


def a_queued_resume(dev, store):
    """Kill a run's step mid-n2 while the resume slot is held: its pipeline and its resume run, QUEUED."""
    run_id = dev.launch("items_job_inprocess", config(item_seconds=0.3))
    rows = wait_for(lambda: len(calls(store, run_id, "n2")) >= 1 and calls(store, run_id, "n2"), timeout=180,
                    what="n2 to start")
    os.kill(rows[0].pid, signal.SIGKILL)
    pipeline = pipeline_of(store, run_id)
    (resume,) = wait_for(lambda: resume_runs(dev, pipeline.id), timeout=120, what="the resume run")
    wait_for(lambda: dev.run(resume.run_id).status == DagsterRunStatus.QUEUED, timeout=60,
             what="the resume run to be queued")
    return pipeline, resume


def test_a_resume_run_held_in_the_queue_past_the_grace_is_still_the_only_resume(dev, store):
    blocker = hold_the_resume_slot(dev)
    pipeline, resume = a_queued_resume(dev, store)
    held_since = time.monotonic()
    # two graces and many ticks go by while the resume run waits in the queue
    wait_for(lambda: time.monotonic() - held_since > 2 * GRACE and dev.run(resume.run_id).status
             == DagsterRunStatus.QUEUED, timeout=180, what=f"{2 * GRACE} s with the resume run queued")
    assert len(resume_runs(dev, pipeline.id)) == 1
    waiting = store.pipelines.get_pipeline(pipeline.id)
    assert waiting.resume_count == 1 and waiting.owner == f"resume-{pipeline.id}-1" and waiting.status == "running"
    dev.client.terminate_run(blocker)
    wait_completed(dev, store, pipeline.id, timeout=300)
    (only,) = assert_exactly_one_resume(dev, store, pipeline.id)
    assert only.run_id == resume.run_id and store.pipelines.get_pipeline(pipeline.id).owner == resume.run_id


def test_a_resume_run_its_user_cancels_while_queued_cancels_the_pipeline_and_nothing_resumes_it(dev, store):
    # The user's cancel is the user's word whichever run of the pipeline it hits: the pipeline
    # becomes `canceled` (terminal), as when the first run is canceled; no other resume is requested.
    blocker = hold_the_resume_slot(dev)
    try:
        pipeline, resume = a_queued_resume(dev, store)
        dev.client.terminate_run(resume.run_id)
        dev.wait_run(resume.run_id, statuses=(DagsterRunStatus.CANCELED,), timeout=60)
        wait_for(lambda: store.pipelines.get_pipeline(pipeline.id).status == "canceled", timeout=60,
                 what="the pipeline to be canceled with its queued resume run")
        since = time.time()
        wait_for(lambda: sensor_ticks_since(dev, since) >= 3, timeout=120, what="three more sensor ticks")
        assert len(resume_runs(dev, pipeline.id)) == 1
        after = store.pipelines.get_pipeline(pipeline.id)
        assert (after.status, after.resume_count, after.owner) == ("canceled", 1, f"resume-{pipeline.id}-1")
    finally:
        dev.client.terminate_run(blocker)
