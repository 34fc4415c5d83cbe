"""Hostile rows never stop the rest: each bad row is failed with a reason or reported by `status`,
and the scan and every CLI command keep serving every other row."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import text, update

from helpers import expire
from recovery_ext.cli import main
from recovery_ext.recovery import scan
from recovery_ext.schema import pipelines, queue_items


def orphan(store, name):
    own = store.create_pipeline("job", ["a", "b"], owner=name, origin_run_id=name)
    store.start_node(own, "a")
    expire(store, own.pipeline_id)
    return own.pipeline_id


def corrupt(store, pipeline_id, sql_value: dict) -> None:
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id).values(**sql_value))


def test_one_corrupt_row_of_each_kind_and_the_healthy_orphans_are_still_reclaimed(store, db_url):
    healthy = [orphan(store, f"healthy-{i}") for i in range(3)]
    bad = {kind: orphan(store, f"bad-{kind}") for kind in ("epoch", "resume_count", "time", "status")}
    corrupt(store, bad["epoch"], {"epoch": 2**31 - 1})
    corrupt(store, bad["resume_count"], {"resume_count": 2**31 - 1, "max_resumes": 2**31 - 1})
    corrupt(store, bad["status"], {"status": "exploded"})
    with store.write() as conn:  # a time column that is not a time: '-infinity' / text
        value = "'-infinity'" if store.dialect.name == "postgresql" else "'soon'"
        conn.execute(text(f"UPDATE rx_pipelines SET created_at = {value} WHERE id = {bad['time']}"))
    unwatched = store.create_pipeline("job", ["a"], owner="no-deadlines", origin_run_id="no-deadlines")
    corrupt(store, unwatched.pipeline_id, {"heartbeat_deadline": None})
    store.enqueue("ocr", [{"n": 1}, {"n": 2}])
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id == 1).values(status="sideways"))
    with store.write() as conn:  # and a '-infinity'/text time on a queue item
        value = "'-infinity'" if store.dialect.name == "postgresql" else "'later'"
        conn.execute(text(f"UPDATE rx_queue_items SET created_at = {value} WHERE id = 2"))

    stats = scan(store, trigger="sensor")
    assert stats.error is None, stats.error
    assert sorted(r.pipeline_id for r in stats.reclaimed_pipelines) == healthy
    reasons = {g.pipeline_id: g.reason for g in stats.given_up_pipelines}
    assert set(reasons) == set(bad.values())
    assert "epoch out of range" in reasons[bad["epoch"]]
    assert "resume_count out of range" in reasons[bad["resume_count"]]
    assert "created_at is not a finite time" in reasons[bad["time"]]
    assert "unknown pipeline status" in reasons[bad["status"]]
    for pipeline_id in bad.values():
        assert store.get_pipeline(pipeline_id).status == "failed"
        assert any(t["event"] == "corrupt" for t in store.transitions_for(pipeline_id=pipeline_id))
    kinds = [e["kind"] for e in store.recent_events(limit=100) if e["pipeline_id"] in bad.values()]
    assert kinds.count("pipeline_stuck") == len(bad)

    runner = CliRunner()
    for args in (["status"], ["pipelines", "list"], ["events"], ["reset-stuck", "--dry-run"], ["recover"],
                 *[["pipelines", "show", str(i)] for i in [*healthy, *bad.values()]]):
        result = runner.invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code == 0, (args, result.output)
    status = json.loads(runner.invoke(main, ["--database-url", db_url, "status", "--json"]).output)
    assert [u["id"] for u in status["unwatched_pipelines"]] == [unwatched.pipeline_id]
    assert status["unknown_status_items"] == [{"id": 1, "queue": "ocr", "status": "sideways"}]
