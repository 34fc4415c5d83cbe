"""What the first-crash walkthrough (docs/get-started/first-crash.md) says a new user sees, step by step.

The demo's ops log one line per item (the cue to crash a run mid-step), the demo's LLM stand-in
reports usage so the ledger and `recovery-ext costs` show tokens and cost, and `recovery-ext demo`
without the `pipelines` extra says what to install in one line and writes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, in_process_executor

from recovery_ext import RecoveryResource, execute_in_process
from recovery_pipelines.assembly import DEMO_PRICES
from recovery_pipelines.demo_llm import serve
from recovery_pipelines.llm import LLMResource
from recovery_pipelines.ocr import make_ocr_job
from recovery_pipelines.ontology import SourceDatabase, make_ontology_job
from recovery_pipelines.ontology_schema import MIGRATIONS
from recovery_pipelines.sample_data import create_sample_database, create_scanned_pdfs

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "recovery-ext"


@pytest.fixture(scope="module")
def demo_llm():
    server, url = serve(latency=0)
    yield url
    server.shutdown()


def user_messages(instance: DagsterInstance, run_id: str, step: str) -> list[str]:
    """What the step logged through context.log (its event log in the UI)."""
    return [e.user_message for e in instance.all_logs(run_id) if e.step_key == step and not e.is_dagster_event]


def test_the_ontology_logs_a_line_per_table_and_its_calls_cost_tokens_and_money(db_url, tmp_path, demo_llm):
    shop = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    create_sample_database(shop)
    llm = LLMResource(base_url=demo_llm, model="demo-llm", prices=DEMO_PRICES)
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(
            make_ontology_job(executor_def=in_process_executor), instance=instance,
            resources={"recovery": RecoveryResource(database_url=db_url, migration_packages=[MIGRATIONS]),
                       "llm": llm, "source": SourceDatabase(url=shop)})
        assert result.success
        described = [m for m in user_messages(instance, result.run_id, "enrich_columns") if "described table" in m]
        profiled = [m for m in user_messages(instance, result.run_id, "profile_columns") if "profiled table" in m]
    # the walkthrough's cue: one line per table, as the step gets through them
    assert len(described) == 10 and len(profiled) == 10
    assert any(m.startswith("llm openai-compatible model=demo-llm") and "described table customers:" in m
               for m in described)
    costs = json.loads(subprocess.run([str(CLI), "--database-url", db_url, "--json", "costs"], capture_output=True,
                                      text=True, check=True, timeout=60).stdout)
    total = costs  # the totals are at the top level
    assert total["calls"] > 0 and total["tokens_in"] > 0 and total["tokens_out"] > 0
    expected = (total["tokens_in"] * 0.15 + total["tokens_out"] * 0.6) / 1e6
    assert total["cost"] > 0 and total["cost"] == pytest.approx(expected, abs=1e-8)


@pytest.mark.timeout(240)
def test_the_ocr_job_logs_a_line_per_document(db_url, tmp_path):
    folder = tmp_path / "scans"
    names = create_scanned_pdfs(folder, {"invoice-a.pdf": ["INVOICE 17", "total 42 EUR"],
                                         "invoice-b.pdf": ["INVOICE 18", "total 7 EUR"]})
    job = make_ocr_job(str(folder), executor_def=in_process_executor)
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(
            job, instance=instance, resources={"recovery": RecoveryResource(database_url=db_url)}
        )
        assert result.success
        lines = [m for m in user_messages(instance, result.run_id, "ocr_documents") if "recognised:" in m]
    assert len(lines) == len(names) == 2
    assert all("1 page(s)" in line for line in lines)


def test_demo_setup_without_the_pipelines_extra_says_so_in_one_line_and_writes_nothing(tmp_path):
    # the extra's image library is missing, as in a core-only install
    code = "import sys; sys.modules['PIL'] = None; from recovery_ext._cli import main; main()"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERY_", "DAGSTER_"))}
    for command in (["demo", "setup"], ["demo", "add-documents", "2"]):
        done = subprocess.run([sys.executable, "-c", code, *command], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines() == [
            "Error: the demo needs the pipelines extra (missing: PIL): pip install -e '.[pipelines]' from the "
            "project's root"]
        assert list(tmp_path.iterdir()) == []


def test_a_dead_runs_own_log_names_its_recovery_at_the_tick_that_reclaims_it(store, db_url):
    """A killed run worker's run is FAILURE at once (the code server saw its child die); the reclaim's
    explanation lands in that run's log at the same tick, before any resume run starts."""
    from dagster import DagsterRunStatus, build_sensor_context, instance_for_test
    from dagster._core.test_utils import create_run_for_test

    from e2e_defs import items_job
    from recovery_ext import make_orphan_sensor

    with instance_for_test() as instance:
        dead = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE)
        own = store.pipelines.create_pipeline("items_job", ["a"], owner=dead.run_id, origin_run_id=dead.run_id)
        store.pipelines.start_node(own, "a")
        sensor = make_orphan_sensor([items_job], minimum_interval_seconds=5)
        context = build_sensor_context(instance=instance, resources={
            "recovery": RecoveryResource(database_url=db_url, deployment="default")})
        (request,) = sensor.evaluate_tick(context).run_requests
        messages = [e.message for e in instance.all_logs(dead.run_id) if e.is_dagster_event
                    and e.dagster_event.event_type_value == "ENGINE_EVENT"]
    assert request.tags["recovery/pipeline_id"] == str(own.pipeline_id)
    assert (f"recovery-ext: pipeline {own.pipeline_id} was taken over because Dagster reported its run dead; "
            f"resumed as resume #1 (run key recovery-{own.pipeline_id}-1)") in messages


def test_a_mass_take_over_explains_dead_runs_only_within_its_budget(caplog):
    """After a mass kill the tick writes the take-over into the dead runs' own logs for at most its budget,
    and says how many it left: the resume runs are never held back by thousands of engine events."""
    from dagster import DagsterRunStatus, instance_for_test
    from dagster._core.test_utils import create_run_for_test

    from recovery_ext._dagster.resume_runs import stop_superseded
    from recovery_ext._store.models import Reclaimed

    def explained(instance, run_id):
        return [e for e in instance.all_logs(run_id) if e.is_dagster_event
                and e.dagster_event.event_type_value == "ENGINE_EVENT"]

    with instance_for_test() as instance:
        dead = [create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE).run_id
                for _ in range(3)]
        taken = [Reclaimed(pipeline_id=n, job_name="items_job", params={}, previous_owner=run_id, owner=None,
                           epoch=2, resume_number=1) for n, run_id in enumerate(dead, 1)]
        with caplog.at_level("INFO", logger="recovery_ext"):
            assert stop_superseded(instance, taken, lambda r: f"taken over: {r.pipeline_id}",
                                   explain_budget_seconds=0) == []
        assert [explained(instance, run_id) for run_id in dead] == [[], [], []]
        assert "3 more superseded runs had already ended" in caplog.text
        stop_superseded(instance, taken, lambda r: f"taken over: {r.pipeline_id}")
        assert [[e.message for e in explained(instance, run_id)] for run_id in dead] == [
            [f"taken over: {n}"] for n in (1, 2, 3)]
