"""A step process killed (-9) while its run worker lives: the multiprocess executor then raises
``DagsterSubprocessError`` at run end. That is a crash, not a verdict: the pipeline must be left to
recovery (node still ``running``), never failed. Found by bench/liveness_bench.py's ``step`` fault,
where a linear job's run ended before the node heartbeat expired and the pipeline was failed for good.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dagster import DagsterInstance, build_reconstructable_job, execute_job
from sqlalchemy import select

import e2e_defs
from recovery_ext._store.models import PassPlan
from recovery_ext._store.schema import transitions
from helpers import reclaim

NODES = ("n1", "n2", "n3", "n4")


def test_a_killed_step_process_leaves_the_pipeline_to_recovery_not_failed(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    run_config = {"ops": {n: {"config": {"items": 2, "item_seconds": 0.0}} for n in NODES}}
    run_config["ops"]["n2"]["config"]["kill_at"] = 1
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        result = execute_job(build_reconstructable_job(
            "e2e_defs", "bound_items_job", reconstructor_working_directory=str(Path(e2e_defs.__file__).parent)),
            instance=instance, run_config=run_config, raise_on_error=False)
        assert not result.success
        logged = " ".join(e.message or "" for e in instance.all_logs(result.run_id))
    assert "step process(es) died (1); pipeline" in logged  # one crashed child inside the executor's error
    assert "is left to recovery" in logged
    (p,) = store.reports.list_pipelines()
    assert (p.status, p.error) == ("running", None)
    statuses = {n.name: n.status for n in store.pipelines.list_nodes(p.id)}
    assert statuses == {"n1": "completed", "n2": "running", "n3": "pending", "n4": "pending"}
    with store.read() as conn:
        assert "failed" not in conn.execute(select(transitions.c.to_status).where(
            transitions.c.pipeline_id == p.id)).scalars().all()
    # the dead owner makes it an orphan at once, and the reclaim resets the killed node
    reclaimed, given_up = reclaim(store, PassPlan(dead_owner_runs=[result.run_id], launching=True))
    assert [r.pipeline_id for r in reclaimed] == [p.id] and given_up == []
    assert reclaimed[0].reset_nodes == ("n2",)
