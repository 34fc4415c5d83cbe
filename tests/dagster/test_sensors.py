"""Sensor factories evaluated against a real Dagster instance, and definitions.py resolving."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, build_sensor_context, instance_for_test
from dagster._core.test_utils import create_run_for_test
from sqlalchemy import select, update

from e2e_defs import items_job
from helpers import expire
from recovery_pipelines.ocr import make_ocr_job
from recovery_ext import RecoveryResource, make_orphan_sensor, make_stuck_item_sensor
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._dagster.resume_runs import RUN_KEY_TAG, TAG_OP_SELECTION
from recovery_ext._dagster.sensors import TAG_QUEUE
from recovery_ext._store.models import PassPlan, PipelineLimits
from recovery_ext._store.schema import events
from datetime import UTC

ROOT = Path(__file__).resolve().parents[2]



def evaluate(sensor, instance, db_url, **resource):
    """One tick; the deployment is the one `store.pipelines.create_pipeline` writes by default unless a test names
    another."""
    resource.setdefault("deployment", "default")
    ctx = build_sensor_context(instance=instance,
                               resources={"recovery": RecoveryResource(database_url=db_url, **resource)})
    result = sensor.evaluate_tick(ctx)
    return result, ctx


def launch(instance, request, status=DagsterRunStatus.NOT_STARTED):
    """What the daemon does with a RunRequest: a run tagged with its run key."""
    return create_run_for_test(instance, job_name=request.job_name, status=status,
                               tags={**request.tags, RUN_KEY_TAG: request.run_key})


def orphan(store, owner, job="items_job", **kw):
    own = store.pipelines.create_pipeline(job, ["a", "b"], owner=owner, origin_run_id=owner,
                                params={"ops": {"a": {"config": {"x": 1}}}}, **kw)
    store.pipelines.start_node(own, "a")
    expire(store, own.pipeline_id)
    return own


def test_orphan_sensor_yields_one_resume_per_orphan_with_tags_and_config(store, db_url, instance):
    run = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.STARTED)
    own = orphan(store, run.run_id)
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    result, _ = evaluate(sensor, instance, db_url)
    (request,) = result.run_requests
    assert request.run_key == f"recovery-{own.pipeline_id}-1" and request.job_name == "items_job"
    assert request.run_config == {"ops": {"a": {"config": {"x": 1}}}}
    assert {k: v for k, v in request.tags.items() if k.startswith("recovery/")} == {
        TAG_PIPELINE: str(own.pipeline_id), TAG_RESUME_NUMBER: "1", TAG_RESUMED_FROM: run.run_id}
    old = instance.get_run_by_id(run.run_id)
    assert old.status == DagsterRunStatus.FAILURE  # the UI no longer shows the dead run as running
    # the superseded run was asked to stop first; the outcome is recorded in an event
    with store.read() as conn:
        (payload,) = conn.execute(select(events.c.payload).where(events.c.kind == "superseded_run_stopped",
                                                                 events.c.pipeline_id == own.pipeline_id)).scalars()
    assert payload["run_id"] == run.run_id and payload["marked_failed"] is True
    # its heartbeat had stopped: a frozen worker is not terminated through the code server, only failed
    assert payload["terminate"].startswith("not terminated: its run worker stopped heartbeating")
    launch(instance, request)
    again, _ = evaluate(sensor, instance, db_url)
    assert again.run_requests == [] and "0 orphans" in again.skip_message


def test_a_run_the_sensor_supersedes_is_failed_without_a_dagster_run_retry(store, db_url):
    """Its pipeline already continues in the resume run: a run retry could only fail to take it over."""
    with instance_for_test(overrides={"run_retries": {"enabled": True, "max_retries": 2}}) as inst:
        run = create_run_for_test(inst, job_name="items_job", status=DagsterRunStatus.STARTED,
                                  tags={"dagster/max_retries": "3"})
        own = orphan(store, run.run_id)
        (request,) = evaluate(make_orphan_sensor([items_job]), inst, db_url)[0].run_requests
        assert request.tags[TAG_PIPELINE] == str(own.pipeline_id)
        old = inst.get_run_by_id(run.run_id)
        assert old.status == DagsterRunStatus.FAILURE
        assert (old.tags["dagster/max_retries"], old.tags["dagster/will_retry"]) == ("0", "false")


def test_a_failed_owner_awaiting_dagsters_retry_decision_is_left_to_it_for_a_grace(store, db_url):
    """Dagster writes a failed run's status, then its dagster/will_retry tag: between the two, a tick
    that took the run for dead would race the retry it stands aside for."""
    from datetime import datetime, timedelta

    from dagster import DagsterEvent, DagsterEventType

    from recovery_ext._dagster.resume_runs import RETRY_DECISION_GRACE_SECONDS

    def fail_without_decision(inst, run, ago: float = 0.0):  # the status write alone, as Dagster makes it first
        event = DagsterEvent(event_type_value=DagsterEventType.PIPELINE_FAILURE.value, job_name=run.job_name,
                             message="the run worker died")
        inst.run_storage.handle_run_event(run.run_id, event,
                                          datetime.now(UTC) - timedelta(seconds=ago))

    with instance_for_test(overrides={"run_retries": {"enabled": True, "max_retries": 1}}) as inst:
        sensor = make_orphan_sensor([items_job])
        deciding = create_run_for_test(inst, job_name="items_job", status=DagsterRunStatus.STARTED)
        fail_without_decision(inst, deciding)
        own = orphan(store, deciding.run_id)
        long_ago = create_run_for_test(inst, job_name="items_job", status=DagsterRunStatus.STARTED)
        fail_without_decision(inst, long_ago, ago=RETRY_DECISION_GRACE_SECONDS + 5)
        stale = store.pipelines.create_pipeline(
            "items_job", ["a"], owner=long_ago.run_id, origin_run_id=long_ago.run_id
        )
        assert inst.get_run_by_id(deciding.run_id).status == DagsterRunStatus.FAILURE
        (request,) = evaluate(sensor, inst, db_url)[0].run_requests
        # the run whose decision is overdue is dead; the other one is left to Dagster, though its heartbeat expired
        assert request.tags[TAG_PIPELINE] == str(stale.pipeline_id)
        assert store.pipelines.get_pipeline(own.pipeline_id).epoch == 1
        launch(inst, request)
        inst.add_run_tags(deciding.run_id, {"dagster/will_retry": "false"})  # Dagster decided: no retry
        (request,) = evaluate(sensor, inst, db_url)[0].run_requests
        assert request.tags[TAG_PIPELINE] == str(own.pipeline_id)


def test_a_tick_that_failed_after_its_reclaim_is_made_good_by_the_next_tick(store, db_url, instance):
    own = orphan(store, "dead-lost-tick")
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    first, _ = evaluate(sensor, instance, db_url)  # as if the daemon never got these requests
    (lost,) = first.run_requests
    second, _ = evaluate(sensor, instance, db_url)
    (again,) = second.run_requests
    assert again.run_key == lost.run_key and again.tags == lost.tags
    assert store.pipelines.get_pipeline(own.pipeline_id).epoch == 2  # re-requested, not reclaimed again
    launch(instance, again)
    third, _ = evaluate(sensor, instance, db_url)
    assert third.run_requests == []


def test_only_the_sensor_that_reclaimed_re_requests(store, db_url, instance):
    orphan(store, "dead-twin")
    mine = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    twin = make_orphan_sensor([items_job], name="twin_orphan_sensor", minimum_interval_seconds=1)
    assert len(evaluate(mine, instance, db_url)[0].run_requests) == 1
    assert evaluate(twin, instance, db_url)[0].run_requests == []
    assert len(evaluate(mine, instance, db_url)[0].run_requests) == 1


def test_a_queued_resume_run_keeps_its_reservation_past_the_grace(store, db_url, instance):
    own = orphan(store, "dead-queued")
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    (request,) = evaluate(sensor, instance, db_url, launch_grace_seconds=60)[0].run_requests
    launch(instance, request, status=DagsterRunStatus.STARTING)
    expire(store, own.pipeline_id)  # the grace ran out while the run waited in the queue
    result, _ = evaluate(sensor, instance, db_url, launch_grace_seconds=60)
    assert result.run_requests == []
    pipeline = store.pipelines.get_pipeline(own.pipeline_id)
    assert pipeline.epoch == 2 and pipeline.owner == f"resume-{own.pipeline_id}-1" and pipeline.status == "running"


def test_a_resume_run_that_ends_before_attaching_is_dead_at_once(store, db_url, instance):
    own = orphan(store, "dead-early")
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    (request,) = evaluate(sensor, instance, db_url, launch_grace_seconds=600)[0].run_requests
    launch(instance, request, status=DagsterRunStatus.FAILURE)  # e.g. its run worker could not start
    (second,) = evaluate(sensor, instance, db_url, launch_grace_seconds=600)[0].run_requests
    assert second.tags[TAG_RESUME_NUMBER] == "2" and second.tags[TAG_RESUMED_FROM] == f"resume-{own.pipeline_id}-1"
    assert store.pipelines.get_pipeline(own.pipeline_id).epoch == 3


def test_a_resume_run_keeps_what_the_user_launched(store, db_url, instance):
    run = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE, op_selection=["n2"],
                              tags={"team": "ocr", "dagster/priority": "7", "dagster/partition": "2026-01-01",
                                    "dagster/sensor_name": "someone", ".dagster/repository": "x"})
    own = store.pipelines.create_pipeline("items_job", ["n2"], owner=run.run_id, origin_run_id=run.run_id,
                                params={"ops": {"n2": {"config": {"items": 2}}}})
    (request,) = evaluate(make_orphan_sensor([items_job]), instance, db_url)[0].run_requests
    assert request.run_config == {"ops": {"n2": {"config": {"items": 2}}}}
    assert {k: v for k, v in request.tags.items() if k != "dagster/sensor_name"} == {
        "team": "ocr",
        "dagster/priority": "7",
        "dagster/partition": "2026-01-01",
        TAG_OP_SELECTION: '["n2"]',
        TAG_PIPELINE: str(own.pipeline_id),
        TAG_RESUME_NUMBER: "1",
        TAG_RESUMED_FROM: run.run_id,
    }
    assert request.tags["dagster/sensor_name"] == "recovery_orphan_sensor"  # Dagster's own, not the first run's


def test_a_failed_owner_run_is_an_orphan_at_once(store, db_url, instance):
    run = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE)
    own = store.pipelines.create_pipeline("items_job", ["a"], owner=run.run_id, origin_run_id=run.run_id)
    live = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.STARTED)
    store.pipelines.create_pipeline("items_job", ["a"], owner=live.run_id, origin_run_id=live.run_id)
    result, _ = evaluate(make_orphan_sensor([items_job]), instance, db_url)
    assert [r.tags[TAG_PIPELINE] for r in result.run_requests] == [str(own.pipeline_id)]


def test_no_cap_by_default_one_tick_takes_every_orphan(store, db_url, instance):
    owns = [orphan(store, f"dead-all-{i}") for i in range(25)]
    result, _ = evaluate(make_orphan_sensor([items_job]), instance, db_url)
    assert sorted(int(r.tags[TAG_PIPELINE]) for r in result.run_requests) == [o.pipeline_id for o in owns]


def test_launches_at_most_k_per_tick_oldest_first_and_reclaims_only_those(store, db_url, instance):
    owns = [orphan(store, f"dead-{i}") for i in range(5)]
    sensor = make_orphan_sensor([items_job], max_resumes_per_tick=2)
    result, _ = evaluate(sensor, instance, db_url)
    assert [int(r.tags[TAG_PIPELINE]) for r in result.run_requests] == [o.pipeline_id for o in owns[:2]]
    assert [store.pipelines.get_pipeline(o.pipeline_id).epoch for o in owns] == [2, 2, 1, 1, 1]


def test_gives_up_and_ignores_other_jobs(store, db_url, instance):
    hopeless = orphan(store, "dead-h", limits=PipelineLimits(max_resumes=0))
    other = orphan(store, "dead-o", job="another_job")
    result, _ = evaluate(make_orphan_sensor([items_job]), instance, db_url)
    assert isinstance(result.skip_message, str) and "1 given up" in result.skip_message
    assert store.pipelines.get_pipeline(hopeless.pipeline_id).status == "failed"
    assert store.pipelines.get_pipeline(other.pipeline_id).epoch == 1


def test_cli_reclaimed_pipelines_are_launched_by_the_sensor(store, db_url, instance):
    from recovery_ext import scan

    own = orphan(store, "dead-cli")
    assert scan(store, PassPlan(trigger="cli")).reclaimed == 1
    assert store.pipelines.get_pipeline(own.pipeline_id).owner is None
    result, _ = evaluate(make_orphan_sensor([items_job]), instance, db_url)
    (request,) = result.run_requests
    assert request.tags[TAG_RESUMED_FROM] == "dead-cli" and request.tags[TAG_RESUME_NUMBER] == "1"
    assert store.pipelines.get_pipeline(own.pipeline_id).owner == f"resume-{own.pipeline_id}-1"


def test_stuck_item_sensor_resets_marks_dead_and_launches_a_queue_run(store, db_url, instance):
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}], max_attempts=1)
    store.queue.enqueue("ocr", [{"n": 3}], max_attempts=3)
    items = store.queue.claim("ocr", "gone", limit=3, heartbeat_timeout=600)
    from sqlalchemy import update

    from recovery_ext._store.schema import queue_items

    with store.write() as conn:  # legacy rows (no heartbeat deadline) started 20 min ago
        conn.execute(update(queue_items).values(started_at=store.dialect.now_plus(-1200), heartbeat_deadline=None))
    sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", stale_after_seconds=600, run_config={"ops": {}})
    result, _ = evaluate(sensor, instance, db_url)
    statuses = sorted(store.queue.get_item(i.id).status for i in items)
    assert statuses == ["dead", "dead", "ready"]
    (request,) = result.run_requests
    assert request.job_name == "ocr_documents" and request.tags[TAG_QUEUE] == "ocr"
    create_run_for_test(instance, job_name="ocr_documents", status=DagsterRunStatus.STARTED, tags={TAG_QUEUE: "ocr"})
    again, _ = evaluate(sensor, instance, db_url)
    assert again.run_requests == [] and "draining it" in again.skip_message


def test_sensor_reports_a_database_outage_without_crashing(instance):
    sensor = make_orphan_sensor([items_job])
    ctx = build_sensor_context(instance=instance, resources={
        "recovery": RecoveryResource(database_url="postgresql://postgres@127.0.0.1:1/none")})
    with pytest.raises(Exception) as info:  # the resource cannot even migrate: a clear store error
        sensor.evaluate_tick(ctx)
    assert "unavailable" in str(info.value) or "connect" in str(info.value)


def test_definitions_load_and_every_job_and_sensor_resolves(tmp_path, monkeypatch):
    monkeypatch.setenv("RECOVERY_DEMO_DIR", str(tmp_path / "demo"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RECOVERY_DATABASE_URL", raising=False)
    from recovery_pipelines.sample_data import prepare_demo

    prepare_demo()  # what `make dev` does through `recovery-ext demo setup`
    spec = importlib.util.spec_from_file_location("definitions_under_test", ROOT / "definitions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    defs = module.defs
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"ontology_extraction", "ocr_documents", "ocr_batches_job"} <= jobs
    sensors = {s.name for s in defs.sensors}
    assert {"recovery_orphan_sensor", "recovery_asset_orphan_sensor", "recovery_stuck_items_ocr"} <= sensors
    for name in sensors:
        assert defs.resolve_sensor_def(name).targets
    for name in ("ontology_extraction", "ocr_documents", "ocr_batches_job"):
        job = defs.resolve_job_def(name)
        assert all(n.definition.tags.get("recovery/node") == "true" for n in job.nodes_in_topological_order)
    assert defs.resources["source"].url == f"sqlite:///{tmp_path / 'demo' / 'shop.sqlite3'}"
    folder = defs.resolve_job_def("ocr_documents").run_config["ops"]["enqueue_documents"]["config"]["folder"]
    assert list(Path(folder).glob("*.pdf"))
    batches = defs.resolve_job_def("ocr_batches_job").partitions_def.get_partition_keys()
    assert len(batches) == -(-len(list(Path(folder).glob("*.pdf"))) // 2) and batches[0] == "batch-000"
    assert (ROOT / "workspace.yaml").read_text().count("definitions.py") == 1


@pytest.mark.parametrize("bad,words", [
    (dict(heartbeat_interval=60, heartbeat_timeout=90), "at most half the timeout"),
    (dict(retry_jitter=2.0), "jitter must be between 0 and 1"),
    (dict(max_resumes=-1), "max_resumes must be a whole number from 0"),
    (dict(launch_grace_seconds=0), "launch_grace_seconds must be at least"),
])
def test_invalid_resource_settings_fail_when_definitions_load(bad, words):
    with pytest.raises(Exception) as info:
        RecoveryResource(**bad)
    assert words in str(info.value)


def test_owners_dagster_is_retrying_are_left_to_the_retry_and_canceled_owners_cancel(store, db_url, instance):
    retried = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE,
                                  tags={"dagster/will_retry": "true"})
    retried_own = store.pipelines.create_pipeline(
        "items_job", ["a"], owner=retried.run_id, origin_run_id=retried.run_id
    )
    retry_over = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE,
                                     tags={"dagster/will_retry": "true"})
    create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.FAILURE,
                        tags={"dagster/parent_run_id": retry_over.run_id})
    over_own = store.pipelines.create_pipeline(
        "items_job", ["a"], owner=retry_over.run_id, origin_run_id=retry_over.run_id
    )
    canceled = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.CANCELED)
    canceled_own = store.pipelines.create_pipeline(
        "items_job", ["a"], owner=canceled.run_id, origin_run_id=canceled.run_id
    )
    result, _ = evaluate(make_orphan_sensor([items_job]), instance, db_url)
    assert [r.tags[TAG_PIPELINE] for r in result.run_requests] == [str(over_own.pipeline_id)]
    assert store.pipelines.get_pipeline(retried_own.pipeline_id).epoch == 1
    assert store.pipelines.get_pipeline(canceled_own.pipeline_id).status == "canceled"


def test_a_stalled_run_whose_worker_still_heartbeats_is_terminated_through_the_run_launcher(store, db_url, instance):
    from recovery_ext._store.schema import nodes

    run = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.STARTED)
    own = store.pipelines.create_pipeline("items_job", ["a", "b"], owner=run.run_id, origin_run_id=run.run_id,
                                limits=PipelineLimits(heartbeat_timeout=600))
    store.pipelines.start_node(own, "a", heartbeat_timeout=600, stall_timeout=600)
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id)
                     .values(stall_deadline=store.dialect.now_plus(-5)))
    (request,) = evaluate(make_orphan_sensor([items_job]), instance, db_url)[0].run_requests
    with store.read() as conn:
        (payload,) = conn.execute(select(events.c.payload).where(events.c.kind == "superseded_run_stopped",
                                                                 events.c.pipeline_id == own.pipeline_id)).scalars()
    assert payload["terminate"] == "launcher could not reach it"  # asked: no gRPC server behind this test run
    assert payload["marked_failed"] is True
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE


def _count_transactions(store):
    """Store transactions begun meanwhile (SQLAlchemy's begin event: one per read, write or autocommit block)."""
    from sqlalchemy import event

    counted = []
    listener = lambda conn: counted.append(1)  # noqa: E731
    event.listen(store.engine, "begin", listener)
    return counted, lambda: event.remove(store.engine, "begin", listener)


def test_an_idle_tick_costs_one_store_transaction(store, db_url, instance):
    """A healthy running pipeline, a finished one and a reservation whose run is queued: nothing to write."""
    from recovery_ext._dagster.resources import shared_store

    run = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.STARTED)
    store.pipelines.create_pipeline("items_job", ["a"], owner=run.run_id, origin_run_id=run.run_id,
                          limits=PipelineLimits(heartbeat_timeout=600))
    done = store.pipelines.create_pipeline("items_job", ["a"], owner="finished", origin_run_id="finished")
    store.pipelines.start_node(done, "a")
    assert store.pipelines.complete_node(done, "a", output=None)
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    evaluate(sensor, instance, db_url)  # the first tick also prunes old events (once per hour per process)
    shared = shared_store(db_url)
    counted, stop = _count_transactions(shared)
    try:
        result, _ = evaluate(sensor, instance, db_url)
    finally:
        stop()
    assert not result.run_requests
    assert len(counted) == 1


def test_a_tick_with_an_orphan_writes_once(store, db_url, instance):
    """Reclaim, reset, transitions, events and the recovery stats commit in one transaction."""
    from recovery_ext._dagster.resources import shared_store

    first = orphan(store, "dead-one")
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    first_tick, _ = evaluate(sensor, instance, db_url)  # also prunes old events, once per hour per process
    launch(instance, first_tick.run_requests[0])
    second = orphan(store, "dead-two")
    counted, stop = _count_transactions(shared_store(db_url))
    try:
        result, _ = evaluate(sensor, instance, db_url)
    finally:
        stop()
    assert [r.run_key for r in result.run_requests] == [f"recovery-{second.pipeline_id}-1"]
    assert store.pipelines.get_pipeline(first.pipeline_id).resume_count == 1
    assert len(counted) == 2  # the snapshot read, then the one write


def test_two_deployments_sharing_the_tables_resume_a_crash_once_in_its_own(store, db_url):
    """Each deployment is its own Dagster instance; only the owner's sensor reclaims and requests the resume."""
    with instance_for_test() as mine, instance_for_test() as theirs:
        run = create_run_for_test(mine, job_name="items_job", status=DagsterRunStatus.STARTED,
                                  tags={"team": "search", "dagster/priority": "5"})
        own = store.pipelines.create_pipeline("items_job", ["a", "b"], owner=run.run_id, origin_run_id=run.run_id,
                                    deployment="blue")
        store.pipelines.start_node(own, "a")
        expire(store, own.pipeline_id)
        sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
        foreign, _ = evaluate(sensor, theirs, db_url, deployment="green")
        assert not foreign.run_requests
        assert store.pipelines.get_pipeline(own.pipeline_id).resume_count == 0
        result, _ = evaluate(sensor, mine, db_url, deployment="blue")
        (request,) = result.run_requests
        assert request.tags["team"] == "search" and request.tags["dagster/priority"] == "5"
        again, _ = evaluate(sensor, theirs, db_url, deployment="green")
        assert not again.run_requests
        assert store.pipelines.get_pipeline(own.pipeline_id).resume_count == 1


def test_a_legacy_pipeline_is_adopted_by_the_deployment_that_knows_its_run(store, db_url):
    """Rows from before deployments existed (deployment 'default') go to the instance that has their first run."""
    with instance_for_test() as mine, instance_for_test() as theirs:
        run = create_run_for_test(mine, job_name="items_job", status=DagsterRunStatus.STARTED)
        own = orphan(store, run.run_id)  # written as 'default', as migration 0011 leaves old rows
        sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
        foreign, _ = evaluate(sensor, theirs, db_url, deployment="green")
        assert not foreign.run_requests
        result, _ = evaluate(sensor, mine, db_url, deployment="blue")
        assert len(result.run_requests) == 1
        with store.read() as conn:
            assert conn.exec_driver_sql(f"SELECT deployment FROM rx_pipelines WHERE id = {own.pipeline_id}"
                                        ).scalar() == "blue"


def test_the_deployment_is_derived_from_the_instance_unless_named(monkeypatch):
    from recovery_ext._dagster.resources import derived_deployment

    with instance_for_test() as one, instance_for_test() as other:
        a, b = derived_deployment(one), derived_deployment(other)
        assert a != b and a.startswith("dagster-") and derived_deployment(one) == a
        assert RecoveryResource(deployment="blue").deployment_name(one) == "blue"
        monkeypatch.setenv("RECOVERY_DEPLOYMENT", "green")
        assert RecoveryResource().deployment_name(one) == "green"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_tick_that_requests_a_run_logs_its_summary(store, db_url, instance):
    """Dagster shows a requesting tick as "1 run requested" only: the summary must be in the tick's logs."""
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}])
    sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", run_config={"ops": {}})
    ctx = build_sensor_context(instance=instance, resources={"recovery": RecoveryResource(database_url=db_url)})
    tick_logs = Lines()
    ctx.log.addHandler(tick_logs)  # the tick's logger: what Dagster keeps as the tick's logs
    result = sensor.evaluate_tick(ctx)
    assert len(result.run_requests) == 1
    assert tick_logs.lines == ["queue ocr: 0 reset, 0 dead, 2 ready; requested a run of ocr_documents"]
