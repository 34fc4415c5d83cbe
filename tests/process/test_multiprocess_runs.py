"""A fresh run of ``@recoverable_op`` nodes under Dagster's multiprocess executor: a step process per node, each
starting Python and importing Dagster, so it lives here, not in tests/dagster."""

from __future__ import annotations

import tempfile
from pathlib import Path

from dagster import DagsterInstance, build_reconstructable_job, execute_job
from sqlalchemy import func, select

import e2e_defs
from e2e_defs import calls

NODES = ("n1", "n2", "n3", "n4")


def config(items: int) -> dict:
    return {"ops": {n: {"config": {"items": items, "item_seconds": 0.0}} for n in NODES}}


def call_counts(store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return dict(conn.execute(select(calls.c.node, func.count()).group_by(calls.c.node)).all())


def test_fresh_run_completes_under_the_multiprocess_executor(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        result = execute_job(build_reconstructable_job(
            "e2e_defs", "bound_items_job", reconstructor_working_directory=str(Path(e2e_defs.__file__).parent)),
            instance=instance, run_config=config(2))
        assert result.success
    (p,) = store.reports.list_pipelines()
    assert p.status == "completed" and call_counts(store) == {n: 2 for n in NODES}
