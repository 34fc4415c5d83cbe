"""A resume runs only what is left: finished nodes are replayed by the run worker (no step process),
the op selection of the resumed run is kept, and the final outputs equal an uninterrupted run's.

Runs go through ``execute_job`` on a real Dagster instance, so the job's own (wrapped) executor
runs: multiprocess and in-process. The crash is the state a ``kill -9`` mid-node leaves behind
(the kill itself is exercised end to end in test_e2e.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dagster import DagsterEventType, ReexecutionOptions, build_reconstructable_job, execute_job
from dagster._core.execution.api import create_execution_plan
from dagster._core.test_utils import create_run_for_test
from sqlalchemy import delete, func, select, update

import replay_defs
from e2e_defs import calls
from helpers import expire, reclaim
from recovery_ext._dagster.replay import UnresumableSelection, split_plan
from recovery_ext._dagster.resume_runs import resume_request
from recovery_ext._dagster.tags import TAG_OP_SELECTION, TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import PassPlan, Reclaimed
from recovery_ext._store.schema import node_items, nodes, pipelines
from recovery_ext._store.store import RecoveryStore

HERE = Path(__file__).resolve().parents[1] / "support"


def recon(name: str):
    return build_reconstructable_job("replay_defs", "bound", reconstructable_args=(name,),
                                     reconstructor_working_directory=str(HERE))



def use_store(url: str, monkeypatch) -> RecoveryStore:
    monkeypatch.setenv("RECOVERY_DATABASE_URL", url)
    store = RecoveryStore(url)
    store.migrate()
    return store


def call_counts(store, run_id=None):
    query = select(calls.c.node, func.count()).group_by(calls.c.node)
    if run_id:
        query = query.where(calls.c.run_id == run_id)
    with store.engine.connect() as conn:
        return dict(conn.execute(query).all())


def interrupt(store, pipeline_id, *, running, pending=(), keep_items=1):
    """What a kill -9 inside ``running`` leaves: it is running with ``keep_items`` items done, ``pending`` not
    started."""
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == running)
                     .values(status="running", completed_at=None, output=None))
        if pending:
            conn.execute(update(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name.in_(pending))
                         .values(status="pending", completed_at=None, output=None))
            conn.execute(delete(node_items).where(node_items.c.pipeline_id == pipeline_id,
                                                  node_items.c.node_name.in_(pending)))
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id).values(status="running", completed_at=None))
        conn.execute(
            delete(node_items).where(
                node_items.c.pipeline_id == pipeline_id,
                node_items.c.node_name == running,
                node_items.c.item_key >= f"{running}-{keep_items}",
            )
        )
    expire(store, pipeline_id)
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    return reclaimed


def resume_tags(reclaimed: Reclaimed) -> dict:
    return {TAG_PIPELINE: str(reclaimed.pipeline_id), TAG_RESUME_NUMBER: str(reclaimed.resume_number)}


def step_events(instance, run_id, event_type):
    return [r.dagster_event for r in instance.all_logs(run_id, of_type=event_type)]


def final_output(result, node="c"):
    return result.output_for_node(node)


@pytest.mark.parametrize("job_name,database", [("mixed_mp", "postgresql"), ("mixed_inproc", "postgresql"),
                                               ("mixed_inproc", "sqlite")])
def test_a_resume_replays_finished_nodes_and_ends_with_the_outputs_of_an_uninterrupted_run(
        job_name, database, instance, monkeypatch, request, tmp_path):
    url = (f"sqlite:///{tmp_path / 'rx.sqlite3'}" if database == "sqlite"
           else request.getfixturevalue("pg_url"))
    store = use_store(url, monkeypatch)
    with execute_job(recon(job_name), instance=instance) as first:
        assert first.success
        expected = final_output(first)
    (p,) = store.reports.list_pipelines()
    recorded = {n.name: n.output for n in store.pipelines.list_nodes(p.id)}
    with store.write() as conn:
        conn.execute(delete(calls))
    reclaimed = interrupt(store, p.id, running="b", pending=("c",))

    with execute_job(recon(job_name), instance=instance, tags=resume_tags(reclaimed)) as second:
        assert second.success
        assert final_output(second) == expected == {"chain": ["a", "plain", "b", "c"], "items": ["c-0", "c-1"]}
    # a replayed, the plain op ran again (no node row), b redid its one unfinished item, c ran
    assert call_counts(store) == {"plain": 1, "b": 1, "c": 2}
    assert {n.name: n.output for n in store.pipelines.list_nodes(p.id)} == recorded
    after = store.pipelines.get_pipeline(p.id)
    assert (after.status, after.owner) == ("completed", second.run_id)

    started = {e.step_key for e in step_events(instance, second.run_id, DagsterEventType.STEP_START)}
    assert started == {"a", "plain", "b", "c"}  # every step still shows in the run
    (a_output,) = [e for e in step_events(instance, second.run_id, DagsterEventType.STEP_OUTPUT) if e.step_key == "a"]
    assert a_output.event_specific_data.metadata["recovery"].value == f"skipped: completed in run {first.run_id}"
    (a_start,) = [e for e in step_events(instance, second.run_id, DagsterEventType.STEP_START) if e.step_key == "a"]
    assert a_start.pid == os.getpid()  # replayed by the run worker (here: this process)
    replayed = [r.message for r in instance.all_logs(second.run_id) if "replaying" in (r.message or "")]
    assert replayed == ["recovery-ext: replaying 1 finished node(s) in the run worker: a"]
    if job_name.endswith("_mp"):
        workers = {e.step_key for e in step_events(instance, second.run_id, DagsterEventType.STEP_WORKER_STARTING)}
        assert workers == {"plain", "b", "c"}  # no step process for the finished node


def test_a_ui_reexecution_that_takes_the_pipeline_over_replays_its_finished_nodes(instance, monkeypatch, pg_url):
    store = use_store(pg_url, monkeypatch)
    run_config = {"ops": {"c": {"config": {"fail_first_run": True}}}}
    with execute_job(recon("mixed_mp"), instance=instance, run_config=run_config, raise_on_error=False) as first:
        assert not first.success
    (p,) = store.reports.list_pipelines()
    assert p.status == "failed"
    with store.write() as conn:
        conn.execute(delete(calls))
    # the UI's "Re-execute all": the same logical run, so the same pipeline, taken over
    options = ReexecutionOptions(parent_run_id=first.run_id)
    with execute_job(recon("mixed_mp"), instance=instance, run_config=run_config,
                     reexecution_options=options) as second:
        assert second.success
        assert final_output(second) == {"chain": ["a", "plain", "b", "c"], "items": ["c-0", "c-1"]}
    assert call_counts(store) == {"plain": 1, "c": 2}
    after = store.pipelines.get_pipeline(p.id)
    assert (after.status, after.owner) == ("completed", second.run_id) and len(store.reports.list_pipelines()) == 1
    workers = {e.step_key for e in step_events(instance, second.run_id, DagsterEventType.STEP_WORKER_STARTING)}
    assert workers == {"plain", "c"}


def test_an_op_selected_run_resumes_only_its_selected_ops(instance, monkeypatch, pg_url):
    store = use_store(pg_url, monkeypatch)
    with execute_job(recon("mixed_inproc"), instance=instance, op_selection=["a", "plain", "b"]) as first:
        assert first.success
    (p,) = store.reports.list_pipelines()
    assert [n.name for n in store.pipelines.list_nodes(p.id)] == ["a", "b"]
    with store.write() as conn:
        conn.execute(delete(calls))
    reclaimed = interrupt(store, p.id, running="b")
    request = resume_request(reclaimed, origin=instance.get_run_by_id(first.run_id))
    assert request.tags[TAG_OP_SELECTION] == '["a", "b", "plain"]'

    # the sensor's RunRequest launches the whole job; the run worker keeps the first run's selection
    with execute_job(recon("mixed_inproc"), instance=instance, run_config=request.run_config,
                     tags=request.tags) as second:
        assert second.success
    assert call_counts(store) == {"plain": 1, "b": 1}  # c, outside the selection, never ran
    started = {e.step_key for e in step_events(instance, second.run_id, DagsterEventType.STEP_START)}
    assert started == {"a", "plain", "b"}
    assert store.pipelines.get_pipeline(p.id).status == "completed"


def test_a_selection_whose_input_comes_from_an_unselected_op_fails_the_resume_with_a_clear_message(
        instance, monkeypatch, sqlite_url):
    store = use_store(sqlite_url, monkeypatch)
    with execute_job(recon("mixed_inproc"), instance=instance) as first:
        assert first.success
    (p,) = store.reports.list_pipelines()
    reclaimed = interrupt(store, p.id, running="c")
    tags = {**resume_tags(reclaimed), TAG_OP_SELECTION: '["c"]'}
    with execute_job(recon("mixed_inproc"), instance=instance, tags=tags, raise_on_error=False) as second:
        assert not second.success
    assert call_counts(store, second.run_id) == {}
    messages = " ".join(r.message or "" for r in instance.all_logs(second.run_id))
    messages += " ".join(str(r.dagster_event.event_specific_data) for r in instance.all_logs(second.run_id)
                         if r.dagster_event and r.dagster_event.event_specific_data)
    assert "takes input from unselected step(s) ['b']" in messages
    assert store.pipelines.get_pipeline(p.id).status == "failed"


def test_a_resume_request_of_an_asset_run_keeps_its_asset_selection_and_partition(instance):
    origin = create_run_for_test(instance, job_name="summary_assets", asset_selection=frozenset({replay_defs.RAW_KEY}),
                                 tags={"dagster/partition": "2026-01-02", "team": "ocr"})
    r = Reclaimed(pipeline_id=7, job_name="summary_assets", params={}, previous_owner=origin.run_id, owner="resume-7-1",
                  epoch=2, resume_number=1, origin_run_id=origin.run_id)
    job_def = replay_defs.defs.resolve_job_def("summary_assets")
    request = resume_request(r, origin=origin, job=job_def)
    assert (request.asset_selection, request.partition_key) == ([replay_defs.RAW_KEY], "2026-01-02")
    assert request.tags["team"] == "ocr" and TAG_OP_SELECTION not in request.tags
    # what the request says, launched: only the selected asset, for that partition
    result = job_def.execute_in_process(instance=instance, asset_selection=request.asset_selection,
                                        partition_key=request.partition_key)
    materialized = {(e.asset_key, e.partition) for e in result.get_asset_materialization_events()
                    for e in [e.event_specific_data.materialization]}
    assert materialized == {(replay_defs.RAW_KEY, "2026-01-02")}

    ranged = create_run_for_test(instance, job_name="summary_assets", asset_selection=frozenset({replay_defs.RAW_KEY}),
                                 tags={"dagster/asset_partition_range_start": "2026-01-01",
                                       "dagster/asset_partition_range_end": "2026-01-03"})
    request = resume_request(r, origin=ranged, job=job_def)
    assert request.tags["dagster/asset_partition_range_start"] == "2026-01-01"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-01-03"
    assert request.asset_selection == [replay_defs.RAW_KEY]


def test_a_plan_with_dynamic_outputs_is_not_split_and_cannot_carry_an_op_selection(sqlite_url, monkeypatch):
    store = use_store(sqlite_url, monkeypatch)
    job_def = replay_defs.fan_out_job
    plan = create_execution_plan(job_def)
    assert split_plan(job_def, plan, store, pipeline_id=1, selection=None) is None  # every step to the executor
    with pytest.raises(UnresumableSelection, match="dynamic outputs"):
        split_plan(job_def, plan, store, pipeline_id=1, selection=["fan_out"])


def test_only_finished_nodes_a_remaining_step_reads_are_replayed_the_rest_are_left_out(sqlite_url, monkeypatch):
    """8 of 9 chained ops done: only r8 (r9 reads it) is replayed; r1..r7 cost nothing at all."""
    store = use_store(sqlite_url, monkeypatch)
    job_def = replay_defs.chain9_inproc
    own = store.pipelines.create_pipeline(job_def.name, list(replay_defs.CHAIN), owner="run-1", origin_run_id="run-1",
                                params={})
    for name in replay_defs.CHAIN[:-1]:
        store.pipelines.start_node(own, name)
        store.pipelines.complete_node(own, name, {"chain": [name]})
    split = split_plan(job_def, create_execution_plan(job_def), store, own.pipeline_id, selection=None)
    assert list(split.replay) == ["r8"]
    assert split.left_out == [f"r{i}" for i in range(1, 8)] and split.ready == []
    assert split.rest == ["r9"]


def test_a_replay_stores_through_its_io_manager_and_initializes_only_what_storing_needs(
        instance, monkeypatch, sqlite_url, tmp_path):
    """The replayed output goes through its own IO manager, which needs a resource of its own (a nested
    resource); the remaining step loads it from there. The resource only the replayed op's body uses is
    not initialized for the replay (no body runs), and the run ends as an uninterrupted one."""
    store = use_store(sqlite_url, monkeypatch)
    with execute_job(recon("stored_inproc"), instance=instance) as first:
        assert first.success
        expected = first.output_for_node("stored_second")
    assert ("body_only", first.run_id) in replay_defs.INITIALIZED  # in-process: this process
    (p,) = store.reports.list_pipelines()
    with store.write() as conn:
        conn.execute(delete(calls))
    reclaimed = interrupt(store, p.id, running="stored_second")

    second = execute_job(recon("stored_inproc"), instance=instance, tags=resume_tags(reclaimed))
    # what the run initialized (entering the result initializes the job's resources again, to load outputs)
    initialized = [name for name, run_id in replay_defs.INITIALIZED if run_id == second.run_id]
    with second:
        assert second.success
        assert second.output_for_node("stored_second") == expected == {
            "chain": ["stored_first", "stored_second"], "folder_io": True}
    assert call_counts(store) == {"stored_second": 1}  # stored_first replayed, its body not run
    # the replay stored through the folder IO manager (its own context), stored_second loaded from it (the
    # run's context for the remaining step); the body's resource was needed by neither
    assert initialized == ["folder", "folder"]
    handled = [e.step_key for e in step_events(instance, second.run_id, DagsterEventType.HANDLED_OUTPUT)]
    assert "stored_first" in handled
