"""Partitioned backfills under a real `dagster dev` (daemon, backfill daemon, run queue, orphan
sensors), with the CPU hog: kill -9 of one partition's run worker mid-way. Only that partition
resumes, its resume redoes only the items the killed run had not finished, and the asset catalog
shows exactly one materialization per partition. Both a job backfill (a partitioned asset job)
and an asset backfill (Dagster's implicit asset job, resumed by the orphan sensor for ASSET_JOB)."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
from dagster import AssetKey
from sqlalchemy import select

from e2e_defs import calls
from recovery_pipelines.devserver import wait_for
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PARTITIONS = [f"part-{i}" for i in range(10)]
ITEMS = 4
PARTITION_TAG = "dagster/partition"
BOOKS = [f"book-{i}" for i in range(4)]
PAGES = 3


DEFS = "assets_e2e_defs.py"


def dagster_yaml(request) -> str:
    # two runs at a time: the backfill stays mid-way long enough to kill one partition's run
    return "telemetry:\n  enabled: false\nrun_queue:\n  max_concurrent_runs: 2\n"


def launch_backfill(dev, params=None) -> str:
    query = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
        __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
    params = params or {"selector": {"partitionSetName": "batch_job_partition_set",
                                     "repositorySelector": {"repositoryLocationName": dev.location,
                                                            "repositoryName": "__repository__"}},
                        "partitionNames": PARTITIONS}
    answer = dev.client._execute(query, {"params": params})["launchPartitionBackfill"]
    assert answer["__typename"] == "LaunchBackfillSuccess", answer
    return answer["backfillId"]


def learn_workers(dev, pipelines, workers: dict[str, int]) -> None:
    """Each running pipeline's run worker pid, looked up (from the run's event log) while the pipeline is still
    early: the kill then follows the mid-way check at once. Looked up after the check, on a loaded machine
    the partition could finish its last items before the kill landed."""
    for p in pipelines:
        if p.status == "running" and p.owner and p.owner not in workers and (pid := dev.run_worker_pid(p.owner)):
            workers[p.owner] = pid


def items_done(store, pipeline_id: int) -> list[str]:
    return sorted(store.pipelines.completed_items(pipeline_id, "batch"))


def calls_by_run(store) -> dict[str, list[str]]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(calls.c.run_id, calls.c.item)).all()
    found: dict[str, list[str]] = {}
    for run_id, item in rows:
        found.setdefault(run_id, []).append(item)
    return found


def test_backfill_killed_mid_way_resumes_only_the_interrupted_partition(dev, app_store):
    store = app_store
    backfill_id = launch_backfill(dev)

    workers: dict[str, int] = {}

    def victim():
        """A partition mid-way (some items done, not all) while others already completed."""
        pipelines = store.reports.list_pipelines()
        learn_workers(dev, pipelines, workers)
        if sum(p.status == "completed" for p in pipelines) < 2:
            return None
        for p in pipelines:
            if p.status == "running" and p.owner in workers and 1 <= len(items_done(store, p.id)) < ITEMS:
                return p
        return None

    pipeline = wait_for(victim, timeout=300, interval=0.05, what="a partition mid-way after two completed ones")
    killed_run = pipeline.owner
    os.kill(workers[killed_run], signal.SIGKILL)
    done_at_kill = items_done(store, pipeline.id)
    partition = dev.run(killed_run).tags[PARTITION_TAG]
    assert 1 <= len(done_at_kill) < ITEMS

    def all_partitions_completed():
        pipelines = store.reports.list_pipelines()
        return len(pipelines) == len(PARTITIONS) and all(p.status == "completed" for p in pipelines)

    wait_for(all_partitions_completed, timeout=400, interval=0.5, what="every partition's pipeline to complete")
    resumes = [r for r in dev.runs(tags={TAG_PIPELINE: str(pipeline.id)}) if TAG_RESUME_NUMBER in r.tags]
    (resume,) = resumes
    assert resume.tags[PARTITION_TAG] == partition
    assert store.pipelines.get_pipeline(pipeline.id).resume_count == 1
    # no other partition resumed: one resume run in the whole deployment
    assert [r.run_id for r in dev.runs() if TAG_RESUME_NUMBER in r.tags] == [resume.run_id]
    dev.wait_run(resume.run_id, timeout=120)
    # the resume redid only what the killed run had not finished
    by_run = calls_by_run(store)
    redone = sorted(by_run[resume.run_id])
    assert redone == sorted(set(f"{partition}/{i}" for i in range(ITEMS)) - set(done_at_kill))
    assert items_done(store, pipeline.id) == [f"{partition}/{i}" for i in range(ITEMS)]
    # every other partition ran exactly once: each item called once, by its one run
    others = Counter(item for run_id, items in by_run.items() if run_id not in (killed_run, resume.run_id)
                     for item in items)
    assert sorted(others) == sorted(f"{p}/{i}" for p in PARTITIONS if p != partition for i in range(ITEMS))
    assert set(others.values()) == {1}
    # the asset catalog: exactly one materialization per partition; the resumed one says what it resumed
    records = dev.instance.fetch_materializations(AssetKey("batch"), limit=100).records
    per_partition = Counter(r.partition_key for r in records)
    assert per_partition == Counter(PARTITIONS)
    (resumed,) = [r.asset_materialization for r in records if r.partition_key == partition]
    assert resumed.metadata["items_resumed"].value == len(done_at_kill)
    assert resumed.metadata["items_done"].value == ITEMS - len(done_at_kill)
    assert resumed.metadata["recovery"].value == f"completed in run {resume.run_id}"
    backfill = dev.instance.get_backfill(backfill_id)
    print(f"backfill {backfill_id}: {backfill.status}; killed {killed_run} of {partition} with "
          f"{len(done_at_kill)}/{ITEMS} items done; resume {resume.run_id} redid {redone}")


def test_asset_backfill_killed_mid_way_resumes_only_the_interrupted_partition_in_the_implicit_job(dev, app_store):
    """The kill hits the downstream asset of a partition whose upstream asset already finished: the
    resume (the orphan sensor for ASSET_JOB, same asset selection and partition) does not run the
    finished asset again (no second materialization) and redoes only the downstream's unfinished items."""
    store = app_store
    launch_backfill(dev, {"assetSelection": [{"path": ["pages"]}, {"path": ["page_index"]}],
                          "partitionNames": BOOKS})

    def asset_pipelines():
        return [p for p in store.reports.list_pipelines() if p.job_name == "__ASSET_JOB"]

    workers: dict[str, int] = {}

    def victim():
        pipelines = asset_pipelines()
        learn_workers(dev, pipelines, workers)
        for p in pipelines:
            nodes = {n.name: n.status for n in store.pipelines.list_nodes(p.id)}
            if p.status == "running" and p.owner in workers and nodes.get("pages") == "completed" and \
                    1 <= len(store.pipelines.completed_items(p.id, "page_index")) < PAGES:
                return p
        return None

    pipeline = wait_for(victim, timeout=240, interval=0.05, what="a partition mid-way through page_index")
    killed_run = pipeline.owner
    os.kill(workers[killed_run], signal.SIGKILL)
    indexed_at_kill = sorted(store.pipelines.completed_items(pipeline.id, "page_index"))
    partition = dev.run(killed_run).tags[PARTITION_TAG]
    assert 1 <= len(indexed_at_kill) < PAGES

    def all_books_completed():
        found = asset_pipelines()
        return len(found) == len(BOOKS) and all(p.status == "completed" for p in found)

    wait_for(all_books_completed, timeout=240, interval=0.5, what="every book's pipeline to complete")
    (resume,) = [r for r in dev.runs(tags={TAG_PIPELINE: str(pipeline.id)}) if TAG_RESUME_NUMBER in r.tags]
    dev.wait_run(resume.run_id, timeout=120)
    assert resume.job_name == "__ASSET_JOB" and resume.tags[PARTITION_TAG] == partition
    assert resume.asset_selection == {AssetKey("pages"), AssetKey("page_index")}
    assert store.pipelines.get_pipeline(pipeline.id).resume_count == 1
    # no other book resumed
    assert [p.id for p in asset_pipelines() if p.resume_count] == [pipeline.id]
    # the resume ran only page_index, and only its items the killed run had not finished
    with store.engine.connect() as conn:
        rows = conn.execute(select(calls.c.run_id, calls.c.node, calls.c.item)).all()
    redone = sorted((node, item) for run_id, node, item in rows if run_id == resume.run_id)
    pages_of = [f"{partition}/page-{i}" for i in range(PAGES)]
    assert redone == sorted(("page_index", f"{p}/index") for p in pages_of if f"{p}/index" not in indexed_at_kill)
    page_runs = {run_id for run_id, node, _ in rows if node == "pages"}
    assert Counter(item for run_id, node, item in rows if node == "pages") == Counter(
        f"{b}/page-{i}" for b in BOOKS for i in range(PAGES))  # every page read once, by one run
    assert resume.run_id not in page_runs
    # the asset catalog: exactly one materialization per partition of each asset
    for key in ("pages", "page_index"):
        records = dev.instance.fetch_materializations(AssetKey(key), limit=100).records
        assert Counter(r.partition_key for r in records) == Counter(BOOKS), key
    (index,) = [r.asset_materialization for r in dev.instance.fetch_materializations(
        AssetKey("page_index"), limit=100).records if r.partition_key == partition]
    assert index.metadata["recovery"].value == f"completed in run {resume.run_id}"
    assert index.metadata["indexed"].value == PAGES and index.metadata["book"].value == partition  # loaded upstream
    assert index.metadata["items_resumed"].value == len(indexed_at_kill)
