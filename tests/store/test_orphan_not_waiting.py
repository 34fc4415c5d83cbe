"""A pipeline whose run ended (or died) during a retry pause is an orphan awaiting its resume, not ``waiting`` with a
next try nobody will make (SQLite and PostgreSQL); it is still reclaimed, exactly once."""

from __future__ import annotations

from click.testing import CliRunner

from recovery_ext import scan
from recovery_ext._cli import main
from recovery_ext._store.models import PassPlan

from helpers import expire


def paused(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a")
    store.providers.set_waiting(own, 120.0, "5 connection errors in a row in a: provider unreachable", node="a")
    assert store.pipelines.get_pipeline(own.pipeline_id).shown_status == "waiting"
    return own


def test_a_run_that_leaves_its_paused_pipeline_to_recovery_ends_the_pause_in_the_same_write(store, db_url):
    own = paused(store)
    assert store.pipelines.leave_to_recovery(own)
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert (p.status, p.shown_status, p.waiting_until, p.waiting_reason) == ("running", "running", None, None)
    assert [o.id for o in store.recovery.find_orphans()] == [own.pipeline_id]
    text = CliRunner().invoke(main, ["--database-url", db_url, "status"]).output
    assert f"pipeline {own.pipeline_id} (job) waiting" not in text and "Orphans now: 1" in text
    assert scan(store, PassPlan(trigger="startup")).reclaimed == 1
    assert scan(store, PassPlan(trigger="startup")).reclaimed == 0  # exactly once
    assert store.pipelines.get_pipeline(own.pipeline_id).epoch == own.epoch + 1


def test_status_shows_an_orphan_whose_run_died_mid_pause_among_orphans_not_waiting(store, db_url):
    own = paused(store)
    assert store.reports.metrics_snapshot().waiting_pipelines != []
    expire(store, own.pipeline_id)  # its run worker died (kill -9): nobody wrote anything
    assert store.providers.waiting_pipelines() == []
    # every view agrees, not only `status` (a review: `pipelines list` and `show`, the metrics and the sensor tick
    # each had their own rule): its pause is still stored, and it is shown as the orphan it is
    assert store.pipelines.get_pipeline(own.pipeline_id).waiting_until is not None
    assert store.pipelines.get_pipeline(own.pipeline_id).shown_status == "running"
    assert [p.shown_status for p in store.reports.list_pipelines()] == ["running"]
    assert store.reports.metrics_snapshot().waiting_pipelines == []
    shown = CliRunner().invoke(main, ["--database-url", db_url, "pipelines", "show", str(own.pipeline_id)])
    assert shown.exit_code == 0 and "next try" not in shown.output and " running " in shown.output, shown.output
    listed = CliRunner().invoke(main, ["--database-url", db_url, "pipelines", "list"]).output
    assert "waiting" not in listed, listed
    text = CliRunner().invoke(main, ["--database-url", db_url, "status"]).output
    assert f"pipeline {own.pipeline_id} (job) waiting" not in text and "Orphans now: 1" in text
    assert scan(store, PassPlan(trigger="startup")).reclaimed == 1
    assert store.pipelines.get_pipeline(own.pipeline_id).shown_status == "running"  # the reclaim ended the pause
