"""What the provider-job crash tests share: a run worker in its own process (tests/support/journal_run.py) that a
test can kill -9, the take-over and in-process resume the orphan sensor would start, and what the resume's
output says it re-attached to."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from dagster import DagsterInstance
from helpers import reclaim_until_taken
from ledger_defs import recovery_resource

from recovery_ext import execute_in_process
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._store.models import PassPlan

HERE = Path(__file__).resolve().parent


def start_worker(module: str, run_config: dict) -> subprocess.Popen:
    """``module.job`` run in its own process, so it can be killed -9."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])])}
    return subprocess.Popen([sys.executable, str(HERE / "journal_run.py"), module, json.dumps(run_config)],
                            cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def resume(store, the_job, run_config):
    """Take the dead worker's pipeline over (as the orphan sensor does) and resume it in process."""
    (pipeline,) = store.reports.list_pipelines()
    (reclaimed,) = reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]))
    tags = {TAG_PIPELINE: str(reclaimed.pipeline_id), TAG_RESUME_NUMBER: str(reclaimed.resume_number),
            TAG_RESUMED_FROM: reclaimed.previous_owner}
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(the_job, instance=instance, tags=tags, run_config=run_config,
                                    resources={"recovery": recovery_resource()})
    assert result.success
    return pipeline, result


def reattached_to(result, step: str = "describe") -> str | None:
    (output,) = [e for e in result.all_events if e.step_key == step and e.event_type_value == "STEP_OUTPUT"]
    found = output.step_output_data.metadata.get("provider_job_reattached")
    return None if found is None else found.value


def keeper_that_dies(ctx, result_of):
    """``run_provider_job``'s ``keep``: checkpoints each answer as ``result_of(answer)`` and, on a first run (not a
    resume), kills its own process (-9) right after the op config's ``kill_after``-th item, so a test can resume a
    run that died between two results."""
    from recovery_ext._dagster.tags import TAG_RESUME_NUMBER

    resumed = TAG_RESUME_NUMBER in ctx.context.run.tags
    kept = []

    def keep(key, answer) -> None:
        ctx.checkpoint(key, result_of(answer))
        kept.append(key)
        if len(kept) == ctx.op_config["kill_after"] and not resumed:
            os.kill(os.getpid(), signal.SIGKILL)

    return keep
