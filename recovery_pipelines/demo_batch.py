"""The crash demo's batch part: a run killed (-9) while its OpenAI batch is pending is resumed and re-attaches.

``describe`` sends its tables' descriptions as one batch through ``run_provider_job`` to the Batch API at
``$RECOVERY_BATCH_URL`` (the local stand-in of :mod:`recovery_pipelines.batch_stand_in` in the demo and
the tests). :func:`run_batch_demo` starts that stand-in, runs the job in a child process, kills it while
the batch is pending, takes the pipeline over as the orphan sensor would, resumes it, and prints what the
provider counted: one submission, nothing paid twice.

``python -m recovery_pipelines.demo_batch`` runs the job once (the child process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, Field, in_process_executor

from recovery_ext import (NodeContext, OpenAIBatchJobs, RecoveryResource, recoverable_job, recoverable_op,
                          run_provider_job)
from recovery_ext.store import WAITING, PipelineStatus, RecoveryStore
from recovery_ext.testing import execute_in_process
from recovery_pipelines.devserver import wait_for
from recovery_pipelines.llm import OpenAICompatibleEnricher

URL_ENV = "RECOVERY_BATCH_URL"


def request(table: str) -> dict[str, Any]:
    payload = {"table": table, "columns": []}
    return {"model": "m", "messages": OpenAICompatibleEnricher.messages("describe_entity", payload),
            "response_format": {"type": "json_object"}}


@recoverable_op(config_schema={"items": Field(int, default_value=6), "poll_seconds": Field(float, default_value=0.2)})
def describe(ctx: NodeContext) -> dict:
    import openai

    client = openai.OpenAI(base_url=os.environ[URL_ENV], api_key="sk-demo")
    requests = {f"t{i:02d}": request(f"t{i:02d}") for i in range(ctx.op_config["items"])}
    run_provider_job(
        ctx,
        OpenAIBatchJobs(client),
        requests,
        poll_seconds=ctx.op_config["poll_seconds"],
        keep=lambda key, answer: ctx.checkpoint(key, json.loads(answer["choices"][0]["message"]["content"])),
    )
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="batch_job", executor_def=in_process_executor)
def job():
    describe()


def resources() -> dict[str, Any]:
    return {"recovery": RecoveryResource(database_url=os.environ.get("RECOVERY_DATABASE_URL"), heartbeat_interval=0.5,
                                         heartbeat_timeout=3.0)}


# The resume runs inside `make demo-crash`'s own process: Dagster's console logger would interleave its
# step-by-step DEBUG lines with the demo's narration; its INFO lines (the re-attachment) stay.
QUIET_CONSOLE = {"console": {"config": {"log_level": "INFO"}}}


def run(tags: dict[str, str] | None = None, items: int = 6) -> Any:
    with tempfile.TemporaryDirectory() as home:
        # an empty dagster.yaml: without one Dagster warns that it defaults to storing everything in `home`,
        # which is what this throw-away instance wants
        (Path(home) / "dagster.yaml").write_text("", encoding="utf-8")
        with DagsterInstance.local_temp(home) as instance:
            return execute_in_process(job, instance=instance, tags=tags or {}, resources=resources(),
                                      run_config={"ops": {"describe": {"config": {"items": items}}},
                                                  "loggers": QUIET_CONSOLE},
                                      raise_on_error=False)


def run_batch_demo(var: Path, say, *, items: int = 6, duration: float = 6.0) -> list[str]:
    """Kill a run while its batch is pending, resume it, and return what went wrong (empty: all shown)."""
    from recovery_ext import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
    from recovery_ext.store import Scope
    from recovery_ext.store import PassPlan
    from recovery_pipelines.batch_stand_in import BatchProvider

    var.mkdir(parents=True, exist_ok=True)
    db = var / "batch.sqlite3"
    db.unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    store = RecoveryStore(url)
    store.migrate()
    with BatchProvider(duration=duration) as provider:
        env = {**os.environ, "RECOVERY_DATABASE_URL": url, URL_ENV: provider.url}
        say(f"batch: running {items} tables as one OpenAI batch (stand-in on {provider.url})")
        child = subprocess.Popen([sys.executable, "-m", "recovery_pipelines.demo_batch"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: provider.submissions == 1 and any(p.shown_status == WAITING
                                                               for p in store.reports.list_pipelines()),
                     timeout=180, interval=0.05, what="the batch to be pending")
            (pipeline,) = store.reports.list_pipelines()
            say(f"batch: pipeline {pipeline.id} is {pipeline.shown_status}: {pipeline.waiting_reason}")
            child.send_signal(signal.SIGKILL)
        finally:
            child.wait(30)
        say(f"batch: killed the run (-9) while its batch was pending ({len(provider.answered())} answered)")
        (reclaimed,) = store.recovery.recovery_pass(PassPlan(dead_owner_runs=[pipeline.owner]), Scope()).reclaimed
        say(f"batch: pipeline {pipeline.id} taken over (as the orphan sensor does); resuming")
        os.environ["RECOVERY_DATABASE_URL"], os.environ[URL_ENV] = url, provider.url
        result = run({TAG_PIPELINE: str(reclaimed.pipeline_id), TAG_RESUME_NUMBER: str(reclaimed.resume_number),
                      TAG_RESUMED_FROM: reclaimed.previous_owner}, items)
        submissions, answered = provider.submissions, provider.answered()
    paid_twice = sum(n - 1 for n in Counter(a[0] for a in answered).values())
    jobs = store.pipelines.provider_jobs(pipeline.id)
    reattached = [j.job_id for j in jobs] == list(provider.batches)
    status = store.pipelines.get_pipeline(pipeline.id).status
    store.close()
    say(f"batch: the resume re-attached to {jobs[0].job_id if jobs else '?'}: {submissions} submission, "
        f"{paid_twice} paid twice; pipeline {status}")
    problems = []
    if not result.success or status != PipelineStatus.COMPLETED:
        problems.append(f"batch: the resumed pipeline ended {status}")
    if submissions != 1 or paid_twice or not reattached:
        problems.append(f"batch: {submissions} submissions, {paid_twice} paid twice (expected 1 and 0)")
    return problems


if __name__ == "__main__":
    sys.exit(0 if run().success else 1)
