"""A job that reads its scans as one Azure Document Intelligence provider job through ``run_provider_job`` and
``AzureDocumentJobs`` (the azure-ai-documentintelligence SDK) against the stand-in at ``$RECOVERY_AZURE_STAND_IN_URL``,
whose container ``scans`` holds the documents ``d00.png``, ``d01.png``, ...; on its first run (not a resume)
``read_scans`` kills its own process (-9) right after checkpointing ``kill_after`` items, so a test can resume a
run that died between two results. Run by tests/support/journal_run.py."""

from __future__ import annotations

import os

from dagster import Field, in_process_executor

from provider_job_runs import keeper_that_dies

from recovery_ext import AzureDocumentJobs, NodeContext, recoverable_job, recoverable_op, run_provider_job
from recovery_pipelines.azure_document_stand_in import STAND_IN_KEY

URL_ENV = "RECOVERY_AZURE_STAND_IN_URL"
PRICE_PER_PAGE = 0.0015


def document(key: str) -> dict:
    return {"urlSource": f"https://scans.blob.core.windows.net/scans/{key}.png"}


@recoverable_op(config_schema={"items": Field(int, default_value=4), "poll_seconds": Field(float, default_value=0.2),
                               "kill_after": Field(int, default_value=-1)})
def read_scans(ctx: NodeContext) -> dict:
    jobs = AzureDocumentJobs.connect(endpoint=os.environ[URL_ENV], key=STAND_IN_KEY, price_per_page=PRICE_PER_PAGE)
    requests = {f"d{i:02d}": document(f"d{i:02d}") for i in range(ctx.op_config["items"])}
    keep = keeper_that_dies(ctx, lambda answer: {"text": answer["text"], "pages": answer["pages"],
                                                 "result_id": answer["result_id"]})
    run_provider_job(ctx, jobs, requests, poll_seconds=ctx.op_config["poll_seconds"], keep=keep)
    return {"items": len(ctx.completed_items())}


@recoverable_job(name="azure_document_job", executor_def=in_process_executor)
def job():
    read_scans()
