"""A resumed node's output metadata keeps what this run did apart from the node's totals across its runs: the
resume's `items_done` sits beside this run's provider calls (`run_provider_calls`), and the node's whole ledger is
labelled as the node's (`node_provider_*`), so `items_done 2` is never read against the node's 6 calls."""

from __future__ import annotations

from dagster import DagsterInstance, in_process_executor
from sqlalchemy import delete, or_, update

from helpers import expire, reclaim
from ledger_defs import llm_resource, make_ledger_job, recovery_resource
from stand_in_llm import StandInProvider

from recovery_ext import execute_in_process
from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import PassPlan
from recovery_ext._store.schema import node_items, nodes, pipelines, provider_calls


def test_a_resumed_node_says_what_this_run_did_apart_from_the_node_s_totals(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    job = make_ledger_job(in_process_executor)
    config = {"ops": {"ask": {"config": {"items": 6}}}}
    with StandInProvider() as provider, DagsterInstance.ephemeral() as instance:
        resources = {"recovery": recovery_resource(), "llm": llm_resource(provider.url)}
        assert execute_in_process(job, instance=instance, run_config=config, resources=resources).success
        (p,) = store.reports.list_pipelines()
        with store.write() as conn:  # what a kill -9 after 4 of ask's 6 items leaves behind
            conn.execute(update(nodes).where(nodes.c.pipeline_id == p.id)
                         .values(status="running", completed_at=None, output=None))
            conn.execute(update(pipelines).where(pipelines.c.id == p.id).values(status="running", completed_at=None))
            conn.execute(delete(node_items).where(node_items.c.pipeline_id == p.id, node_items.c.item_key >= "t04"))
            conn.execute(delete(provider_calls).where(provider_calls.c.pipeline_id == p.id,  # never asked
                                                      or_(provider_calls.c.item_key >= "t04",
                                                          provider_calls.c.node_name == "summarize")))
        expire(store, p.id)
        (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
        resume = execute_in_process(job, instance=instance, run_config=config, resources=resources, tags={
            TAG_PIPELINE: str(p.id), TAG_RESUME_NUMBER: str(reclaimed.resume_number)})
    assert resume.success
    (output,) = [e for e in resume.all_events if e.step_key == "ask" and e.event_type_value == "STEP_OUTPUT"]
    metadata = {key: value.value for key, value in output.step_output_data.metadata.items()}
    assert (metadata["items_done"], metadata["items_resumed"]) == (2, 4)
    assert metadata["run_provider_calls"] == 2                    # this run: one call per item it did
    assert metadata["node_provider_calls"] == 6                   # the node across its runs: 4, then 2
    assert metadata["node_provider_saved_calls"] == 4             # kept from the first run
    assert not [key for key in metadata if key.startswith("provider_")]  # no unlabelled figure
