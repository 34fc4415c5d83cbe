"""Hostile rows never stop the rest: each bad row is failed with a reason or reported by `status`,
and the scan and every CLI command keep serving every other row."""

from __future__ import annotations

import json

from click.testing import CliRunner
from dagster import build_sensor_context
from sqlalchemy import select, text, update

from helpers import expire
from recovery_ext._cli import main
from recovery_ext import RecoveryResource, make_orphan_sensor, make_stuck_item_sensor
from recovery_ext import scan
from recovery_ext._store.models import ItemCheckpoint, PassPlan, Scope
from recovery_ext._store.schema import pipelines, queue_items



def orphan(store, name):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner=name, origin_run_id=name)
    store.pipelines.start_node(own, "a")
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
    unwatched = store.pipelines.create_pipeline("job", ["a"], owner="no-deadlines", origin_run_id="no-deadlines")
    corrupt(store, unwatched.pipeline_id, {"heartbeat_deadline": None})
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}])
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id == 1).values(status="sideways"))
    with store.write() as conn:  # and a '-infinity'/text time on a queue item
        value = "'-infinity'" if store.dialect.name == "postgresql" else "'later'"
        conn.execute(text(f"UPDATE rx_queue_items SET created_at = {value} WHERE id = 2"))

    stats = scan(store, PassPlan(trigger="sensor"))
    assert stats.error is None, stats.error
    assert sorted(r.pipeline_id for r in stats.reclaimed_pipelines) == healthy
    reasons = {g.pipeline_id: g.reason for g in stats.given_up_pipelines}
    assert set(reasons) == set(bad.values())
    assert "epoch out of range" in reasons[bad["epoch"]]
    assert "resume_count out of range" in reasons[bad["resume_count"]]
    assert "created_at is not a finite time" in reasons[bad["time"]]
    assert "unknown pipeline status" in reasons[bad["status"]]
    for pipeline_id in bad.values():
        assert store.pipelines.get_pipeline(pipeline_id).status == "failed"
        assert any(t["event"] == "corrupt" for t in store.reports.transitions_for(pipeline_id=pipeline_id))
    kinds = [e["kind"] for e in store.reports.recent_events(limit=100) if e["pipeline_id"] in bad.values()]
    assert kinds.count("pipeline_stuck") == len(bad)

    runner = CliRunner()
    for args in (["status"], ["pipelines", "list"], ["events"], ["reset-stuck", "--dry-run"], ["recover"],
                 *[["pipelines", "show", str(i)] for i in [*healthy, *bad.values()]]):
        result = runner.invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code == 0, (args, result.output)
    status = json.loads(runner.invoke(main, ["--database-url", db_url, "status", "--json"]).output)
    assert [u["id"] for u in status["unwatched_pipelines"]] == [unwatched.pipeline_id]
    assert status["unknown_status_items"] == [{"id": 1, "queue": "ocr", "status": "sideways"}]


# -- one test per remaining kind of issue 9's "one bad row stops everything" -----------------------------------

def not_a_time(store, table: str, column: str, row_id: int, *, past: bool = False) -> None:
    """PostgreSQL: an infinity; SQLite: text where epoch seconds belong (compares above every number)."""
    value = ("'-infinity'" if past else "'infinity'") if store.dialect.name == "postgresql" else "'whenever'"
    with store.write() as conn:
        conn.execute(text(f"UPDATE {table} SET {column} = {value} WHERE id = {row_id}"))


def node_id(store, pipeline_id, name="a"):
    from recovery_ext._store.schema import nodes

    with store.read() as conn:
        return conn.scalar(select(nodes.c.id).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == name))


def test_infinite_or_mistyped_pipeline_and_node_times_and_counters_are_failed_and_the_rest_reclaimed(store, db_url):
    healthy = [orphan(store, f"healthy-{i}") for i in range(2)]
    # running, heartbeat deadline that never expires: nothing would ever find it dead
    forever = store.pipelines.create_pipeline("job", ["a"], owner="forever", origin_run_id="forever").pipeline_id
    not_a_time(store, "rx_pipelines", "heartbeat_deadline", forever)
    bad_nodes = {}
    for column in ("heartbeat_deadline", "stall_deadline", "started_at"):
        bad_nodes[column] = orphan(store, f"node-{column}")
        not_a_time(store, "rx_nodes", column, node_id(store, bad_nodes[column]))
    attempts = orphan(store, "node-attempts")
    counter = orphan(store, "mistyped-counter")
    # PostgreSQL refuses text in an integer column; SQLite stores it (and compares it above every number)
    value = "'many'" if store.dialect.name == "sqlite" else str(2**31 - 1)
    with store.write() as conn:
        conn.execute(text(f"UPDATE rx_nodes SET attempts = {2**31 - 1} WHERE id = {node_id(store, attempts)}"))
        conn.execute(text(f"UPDATE rx_pipelines SET resume_count = {value} WHERE id = {counter}"))

    stats = scan(store, PassPlan(trigger="sensor"))
    assert stats.error is None, stats.error
    assert sorted(r.pipeline_id for r in stats.reclaimed_pipelines) == healthy
    reasons = {g.pipeline_id: g.reason for g in stats.given_up_pipelines}
    assert set(reasons) == {forever, attempts, counter, *bad_nodes.values()}
    assert "resume_count out of range" in reasons[counter]
    assert "heartbeat_deadline is not a finite time" in reasons[forever]
    for column, pipeline_id in bad_nodes.items():
        assert f"a running node's {column} is not a finite time" in reasons[pipeline_id]
    assert "a running node's attempts out of range" in reasons[attempts]
    for pipeline_id in reasons:
        assert store.pipelines.get_pipeline(pipeline_id).status == "failed"
        assert [t["event"] for t in store.reports.transitions_for(pipeline_id=pipeline_id)].count("corrupt") == 1
    assert scan(store, PassPlan(trigger="sensor")).found == 0  # failed once; the next tick is idle

    runner = CliRunner()
    for args in (["status"], ["pipelines", "list"], ["events"], ["recover"],
                 *[["pipelines", "show", str(i)] for i in [*healthy, *reasons]]):
        result = runner.invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code == 0, (args, result.output)


def drop_pipeline_behind_the_foreign_keys(store, db_url, pipeline_id: int) -> None:
    """What a hand-made delete (or an import with foreign keys off) leaves: rows pointing at nothing."""
    if store.dialect.name == "postgresql":
        with store.engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))  # foreign-key triggers off
            conn.execute(text(f"DELETE FROM rx_pipelines WHERE id = {pipeline_id}"))
    else:
        import sqlite3

        raw = sqlite3.connect(db_url.removeprefix("sqlite:///"))  # foreign keys are off by default
        raw.execute(f"DELETE FROM rx_pipelines WHERE id = {pipeline_id}")
        raw.commit()
        raw.close()


def test_dangling_references_are_reported_and_never_stop_the_scan_the_stuck_item_sensor_or_the_cli(
        store, db_url, instance):
    healthy = [orphan(store, f"healthy-{i}") for i in range(2)]
    gone = store.pipelines.create_pipeline("job", ["a", "b"], owner="gone", origin_run_id="gone")
    store.pipelines.start_node(gone, "a")
    store.pipelines.checkpoint_item(gone, "a", ItemCheckpoint("k1", {"r": 1}))
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}])
    held_by_gone = store.queue.claim("ocr", "gone:0", own=gone, heartbeat_timeout=600)[0]
    stale_healthy = store.queue.claim("ocr", "crashed:0", heartbeat_timeout=600)[0]
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id == stale_healthy.id)
                     .values(heartbeat_deadline=store.dialect.now_plus(-5)))
    drop_pipeline_behind_the_foreign_keys(store, db_url, gone.pipeline_id)

    stats = scan(store, PassPlan(trigger="sensor"))
    assert stats.error is None and sorted(r.pipeline_id for r in stats.reclaimed_pipelines) == healthy

    status = json.loads(CliRunner().invoke(main, ["--database-url", db_url, "status", "--json"]).output)
    assert sorted((d["kind"], d["pipeline_id"], d["rows"]) for d in status["dangling_rows"]) == [
        ("item_checkpoint", gone.pipeline_id, 1), ("node", gone.pipeline_id, 2),
        ("queue_item_holder", gone.pipeline_id, 1)]
    assert {i["id"] for i in status["stuck_items"]} == {held_by_gone.id, stale_healthy.id}

    from recovery_pipelines.ocr import make_ocr_job

    sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", run_config={"ops": {}})
    result = sensor.evaluate_tick(build_sensor_context(
        instance=instance, resources={"recovery": RecoveryResource(database_url=db_url, deployment="default")}))
    assert len(result.run_requests) == 1  # both reset and claimable again: a queue run is launched
    assert {store.queue.get_item(i).status for i in (held_by_gone.id, stale_healthy.id)} == {"ready"}
    for args in (["pipelines", "list"], ["pipelines", "show", str(gone.pipeline_id)], ["events"],
                 ["reset-stuck", "--dry-run"], ["recover"]):
        result = CliRunner().invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code in (0, 1) and "Traceback" not in result.output, (args, result.output)
        assert (result.exit_code == 1) == (args[:2] == ["pipelines", "show"])  # the missing pipeline: a clear miss


def test_the_stuck_item_sensor_and_status_serve_every_other_item_beside_bad_ones(store, db_url, instance):
    store.queue.enqueue("ocr", [{"n": n} for n in range(6)], max_attempts=3)
    items = store.queue.claim("ocr", "w", limit=4, heartbeat_timeout=600)
    never, mistyped_retry, unknown, stale = (i.id for i in items)
    not_a_time(store, "rx_queue_items", "heartbeat_deadline", never)  # held, and never expires
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id == mistyped_retry)
                     .values(status="ready", worker=None, heartbeat_deadline=None))
        conn.execute(update(queue_items).where(queue_items.c.id == unknown).values(status="sideways"))
        conn.execute(update(queue_items).where(queue_items.c.id == stale)
                     .values(heartbeat_deadline=store.dialect.now_plus(-5)))
        conn.execute(text(f"UPDATE rx_queue_items SET attempts = {2**31 - 1} WHERE id = 5"))
    not_a_time(store, "rx_queue_items", "available_at", mistyped_retry)
    not_a_time(store, "rx_queue_items", "created_at", 6, past=True)  # '-infinity' (PostgreSQL), text (SQLite)

    from recovery_pipelines.ocr import make_ocr_job

    sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", run_config={"ops": {}})
    result = sensor.evaluate_tick(build_sensor_context(
        instance=instance, resources={"recovery": RecoveryResource(database_url=db_url, deployment="default")}))
    assert len(result.run_requests) == 1
    assert store.queue.get_item(stale).status == "ready"  # the healthy stale item was reset
    assert store.queue.get_item(unknown).status == "sideways" and store.queue.get_item(never).status == "processing"
    status = json.loads(CliRunner().invoke(main, ["--database-url", db_url, "status", "--json"]).output)
    assert status["unknown_status_items"] == [{"id": unknown, "queue": "ocr", "status": "sideways"}]
    bad = {i["id"]: i["reason"] for i in status["bad_items"]}
    assert set(bad) == {never, mistyped_retry, 5, 6}
    assert "created_at is not a finite time" in bad[6]
    assert "heartbeat_deadline is not a finite time" in bad[never]
    assert "available_at is not a finite time" in bad[mistyped_retry]
    assert "attempts out of range" in bad[5]
    claimed = store.queue.claim("ocr", "next", limit=10, heartbeat_timeout=60)
    assert {i.id for i in claimed} == {stale, 6}  # every claimable item, none of the bad ones
    for args in (["status"], ["reset-stuck", "--dry-run"], ["reset-stuck"], ["events"], ["retry-dead", "--all"]):
        result = CliRunner().invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code == 0, (args, result.output)


def test_the_orphan_sensor_serves_healthy_orphans_beside_an_unknown_owner_and_a_corrupt_row(store, db_url, instance):
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from e2e_defs import items_job

    dead = [create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE) for _ in range(2)]
    healthy = []
    for run in dead:  # heartbeat still live: only Dagster's FAILURE makes them orphans
        own = store.pipelines.create_pipeline("items_job", ["a"], owner=run.run_id, origin_run_id=run.run_id)
        store.pipelines.start_node(own, "a")
        healthy.append(own.pipeline_id)
    # a pipeline whose first run (a Dagster run id) this Dagster instance has never heard of: another
    # instance's, which it stands aside for
    stranger = orphan(store, "0f0f0f0f-dead-beef-0000-000000000000")
    corrupt_id = orphan(store, "corrupt-epoch")
    corrupt(store, corrupt_id, {"epoch": 2**31 - 1})
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id.in_([stranger, corrupt_id])).values(job_name="items_job"))
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    result = sensor.evaluate_tick(build_sensor_context(
        instance=instance, resources={"recovery": RecoveryResource(database_url=db_url, deployment="default")}))
    keys = sorted(r.run_key for r in result.run_requests)
    assert keys == sorted(f"recovery-{i}-1" for i in healthy)
    assert (store.pipelines.get_pipeline(stranger).epoch, store.pipelines.get_pipeline(stranger).resume_count) == (1, 0)
    failed = store.pipelines.get_pipeline(corrupt_id)
    assert failed.status == "failed" and "epoch out of range" in (failed.gave_up_reason or "")


# -- values Python cannot decode, times with no duration, owners that are not text ------------------------------

DEEP = "[" * 5000 + "]" * 5000  # valid JSON (PostgreSQL stores it as jsonb); json.loads overflows Python's stack


def set_json(store, table: str, column: str, row_id: int, raw: str) -> None:
    """Write JSON text as is, the way a hand-made UPDATE would."""
    value = "CAST(:raw AS jsonb)" if store.dialect.name == "postgresql" else ":raw"
    with store.write() as conn:
        conn.execute(text(f"UPDATE {table} SET {column} = {value} WHERE id = :id"), {"raw": raw, "id": row_id})


def test_json_nested_too_deep_marks_its_row_bad_and_the_scan_sensors_and_cli_serve_the_rest(store, db_url, instance):
    from e2e_defs import items_job
    from recovery_ext._conventions import CorruptJson

    healthy = [orphan(store, f"healthy-{i}") for i in range(2)]
    deep = orphan(store, "deep-params")
    set_json(store, "rx_pipelines", "params", deep, DEEP)
    with store.write() as conn:
        conn.execute(update(pipelines).values(job_name="items_job"))
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}, {"n": 3}])
    stale = store.queue.claim("ocr", "crashed:0", limit=2, heartbeat_timeout=600)
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id.in_([i.id for i in stale]))
                     .values(heartbeat_deadline=store.dialect.now_plus(-5)))
    set_json(store, "rx_queue_items", "payload", stale[0].id, DEEP)
    set_json(store, "rx_queue_items", "payload", 3, DEEP)  # ready, and claimable
    store.record_event("note", {"ok": True})
    with store.read() as conn:
        event_id = conn.scalar(text("SELECT max(id) FROM rx_events"))
    set_json(store, "rx_events", "payload", event_id, DEEP)

    assert isinstance(store.pipelines.get_pipeline(deep).params, CorruptJson)
    assert "nested deeper" in store.pipelines.get_pipeline(deep).params.error
    cli = CliRunner()
    for args in (["status"], ["status", "--json"], ["events"], ["events", "--json"], ["pipelines", "list", "--json"],
                 ["pipelines", "show", str(deep), "--json"], ["reset-stuck", "--dry-run"]):
        result = cli.invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code == 0 and "Traceback" not in result.output, (args, result.output[-500:])
    assert "nested deeper" in cli.invoke(main, ["--database-url", db_url, "events"]).output

    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    result = sensor.evaluate_tick(build_sensor_context(
        instance=instance, resources={"recovery": RecoveryResource(database_url=db_url, deployment="default")}))
    assert sorted(r.run_key for r in result.run_requests) == sorted(f"recovery-{i}-1" for i in healthy)
    failed = store.pipelines.get_pipeline(deep)
    assert failed.status == "failed" and "params is not valid JSON (nested deeper" in failed.gave_up_reason

    from recovery_pipelines.ocr import make_ocr_job

    stuck_sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", run_config={"ops": {}})
    result = stuck_sensor.evaluate_tick(build_sensor_context(
        instance=instance, resources={"recovery": RecoveryResource(database_url=db_url, deployment="default")}))
    assert len(result.run_requests) == 1  # both stale items reset, the deep one too: nothing stopped the rest
    assert {store.queue.get_item(i.id).status for i in stale} == {"ready"}
    claimed = store.queue.claim("ocr", "next", limit=10, heartbeat_timeout=60)
    # the two undecodable payloads are dead with their reason, in the claim; the healthy item is handed out
    healthy_item = next(i.id for i in stale if i.id != stale[0].id)
    assert [i.id for i in claimed] == [healthy_item] and not isinstance(claimed[0].payload, CorruptJson)
    for dead_id in (stale[0].id, 3):
        dead = store.queue.get_item(dead_id)
        assert dead.status == "dead" and dead.last_error.startswith("payload is not valid JSON (nested deeper")
        assert dead.worker is None and isinstance(dead.payload, CorruptJson)  # the row and its raw payload stay
    assert store.queue.claim("ocr", "again", limit=10, heartbeat_timeout=60) == []  # dead: never handed out again
    assert CliRunner().invoke(main, ["--database-url", db_url, "recover"]).exit_code == 0


def test_a_value_just_under_the_depth_limit_still_decodes(store):
    from recovery_ext._conventions import MAX_JSON_DEPTH, CorruptJson

    own = store.pipelines.create_pipeline("job", ["a"], owner="r", params={"ok": 1})
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    set_json(store, "rx_pipelines", "params", own.pipeline_id, nested)
    assert not isinstance(store.pipelines.get_pipeline(own.pipeline_id).params, CorruptJson)
    set_json(store, "rx_pipelines", "params", own.pipeline_id, "[" + nested + "]")
    assert isinstance(store.pipelines.get_pipeline(own.pipeline_id).params, CorruptJson)


def test_infinite_finish_times_have_no_duration_and_every_read_serves_the_rest(store, db_url):
    done = store.pipelines.create_pipeline("job", ["a"], owner="done", origin_run_id="done")
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == done.pipeline_id).values(status="completed"))
    normal = store.pipelines.create_pipeline("job", ["a"], owner="normal", origin_run_id="normal")
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == normal.pipeline_id)
                     .values(status="completed", completed_at=store.dialect.now_plus(10)))
    not_a_time(store, "rx_pipelines", "completed_at", done.pipeline_id)
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}, {"n": 3}])
    first, second = store.queue.claim("ocr", "w", limit=2, heartbeat_timeout=600)
    store.queue.complete_item(first, {"ok": True})
    not_a_time(store, "rx_queue_items", "completed_at", first.id)
    store.queue.fail_item(second, "later")
    not_a_time(store, "rx_queue_items", "available_at", second.id)

    summary = {r["status"]: r for r in store.reports.pipeline_summary()}
    assert summary["completed"]["count"] == 2 and 9 < summary["completed"]["avg_seconds"] < 60  # the finite one
    assert {(r["status"], r["count"]) for r in store.reports.queue_summary()} >= {("completed", 1)}
    assert store.queue.seconds_until_claimable("ocr") is None  # no finite wait: nothing to sleep for
    runner = CliRunner()
    for args in (["status"], ["status", "--json"], ["pipelines", "list", "--json"],
                 ["pipelines", "show", str(done.pipeline_id)], ["reset-stuck", "--dry-run"], ["recover"]):
        result = runner.invoke(main, ["--database-url", db_url, *args])
        assert result.exit_code == 0 and "Traceback" not in result.output, (args, result.output[-500:])


def test_an_owner_that_is_not_text_is_a_bad_row_and_dagster_still_judges_the_others(sqlite_url, instance):
    """SQLite stores a blob in a text column; PostgreSQL refuses it, so this row exists only there."""
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from e2e_defs import items_job
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(sqlite_url)
    store.migrate()
    dead = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE)
    own = store.pipelines.create_pipeline("items_job", ["a"], owner=dead.run_id, origin_run_id=dead.run_id)
    store.pipelines.start_node(own, "a")  # heartbeat still live: only Dagster's FAILURE makes it an orphan
    blob = store.pipelines.create_pipeline("items_job", ["a"], owner="blob", origin_run_id="blob").pipeline_id
    with store.write() as conn:
        conn.execute(text("UPDATE rx_pipelines SET owner = x'00ff10' WHERE id = :id"), {"id": blob})
    assert store.recovery.tick_snapshot(Scope(), grace_seconds=60).run_owners == [dead.run_id]

    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    result = sensor.evaluate_tick(build_sensor_context(
        instance=instance, resources={"recovery": RecoveryResource(database_url=sqlite_url, deployment="default")}))
    assert [r.run_key for r in result.run_requests] == [f"recovery-{own.pipeline_id}-1"]
    failed = store.pipelines.get_pipeline(blob)
    assert failed.status == "failed" and "owner is not text" in failed.gave_up_reason
    for args in (["status", "--json"], ["pipelines", "list", "--json"], ["pipelines", "show", str(blob), "--json"]):
        result = CliRunner().invoke(main, ["--database-url", sqlite_url, *args])
        assert result.exit_code == 0, (args, result.output[-500:])
    store.close()
