"""@recoverable_op under a real Dagster instance, in process: skip, items, fencing, classifier mapping, executors
(the multiprocess executor's run: tests/process/test_multiprocess_runs.py)."""

from __future__ import annotations

import httpx
import pytest
from dagster import DagsterInstance, in_process_executor
from sqlalchemy import create_engine, delete, event, func, inspect, select, text, update
from sqlalchemy.exc import OperationalError
from werkzeug import Response

import e2e_defs
from e2e_defs import calls, items_job_inprocess, optional_job
from helpers import expire, reclaim
from recovery_ext._errors import RecoveryError
from recovery_ext import NodeContext, RecoveryResource, execute_in_process, recoverable_job, recoverable_op, retrying
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._store.models import PassPlan
from recovery_ext._store.schema import events, node_items, nodes, pipelines

NODES = ("n1", "n2", "n3", "n4")


def config(items=3, **node_overrides):
    cfg = {"ops": {n: {"config": {"items": items, "item_seconds": 0.0}} for n in NODES}}
    for node, values in node_overrides.items():
        cfg["ops"][node]["config"].update(values)
    return cfg


def resource(url, **kw):
    settings = dict(database_url=url, heartbeat_interval=0.5, heartbeat_timeout=3, max_retries=3,
                    retry_initial_delay=0.01, retry_max_delay=0.02)
    settings.update(kw)
    return RecoveryResource(**settings)


def call_counts(store):
    with store.engine.connect() as conn:
        return dict(conn.execute(select(calls.c.node, func.count()).group_by(calls.c.node)).all())


def run(job, url, run_config, tags=None, **kw):
    return execute_in_process(job, run_config=run_config, resources={"recovery": resource(url, **kw)}, tags=tags,
                              raise_on_error=False)


def test_fresh_run_completes_the_pipeline_in_process(store, db_url):
    result = run(items_job_inprocess, db_url, config())
    assert result.success
    (p,) = store.reports.list_pipelines()
    assert (p.status, p.owner, p.job_name) == ("completed", result.run_id, "items_job_inprocess")
    assert [n.status for n in store.pipelines.list_nodes(p.id)] == ["completed"] * 4
    assert call_counts(store) == {n: 3 for n in NODES}
    assert result.output_for_node("n4") == {"node": "n4", "items": ["n4-0", "n4-1", "n4-2"]}


def test_the_job_s_call_record_never_fails_on_a_commit_between_its_read_and_its_write(store, db_url):
    """Another connection (the run's heartbeat) commits just after the record has read whether its table exists.
    A read-then-write transaction failed there at once on SQLite (`database is locked`, no busy wait for a stale
    snapshot): the op saw a transient error and retried, and tests counting retries counted one more."""
    interleaved = []

    @event.listens_for(store.engine, "after_cursor_execute")
    def commit_from_elsewhere(conn, cursor, statement, *_):
        if interleaved or "table_info" not in statement and "pg_catalog" not in statement:
            return
        interleaved.append(statement)
        other = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"),
                              connect_args={"timeout": 0} if db_url.startswith("sqlite") else {})
        try:
            with other.begin() as elsewhere:  # what a heartbeat does: one short write, committed
                elsewhere.execute(text("CREATE TABLE IF NOT EXISTS heartbeat_stand_in (at REAL)"))
                elsewhere.execute(text("INSERT INTO heartbeat_stand_in VALUES (1.0)"))
        except OperationalError:
            pass  # the record holds the write lock already: nobody commits in between, as it must be
        finally:
            other.dispose()

    e2e_defs.record_call(store, "run-1", "n1", "n1-0")
    event.remove(store.engine, "after_cursor_execute", commit_from_elsewhere)
    assert interleaved and call_counts(store) == {"n1": 1}


def crash_state(store, pipeline_id, *, running="n3", keep_items=1):
    """What a kill -9 mid-node leaves behind: one node running with some items done, the rest pending."""
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == running)
                     .values(status="running", completed_at=None, output=None))
        conn.execute(update(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == "n4")
                     .values(status="pending", completed_at=None, output=None))
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id)
                     .values(status="running", completed_at=None))
        conn.execute(delete(node_items).where(node_items.c.pipeline_id == pipeline_id,
                                              node_items.c.node_name.in_([running, "n4"]),
                                              node_items.c.item_key >= f"{running}-{keep_items}"))
        conn.execute(delete(calls))
    expire(store, pipeline_id)


def test_resume_skips_completed_nodes_and_redoes_only_unfinished_items(store, db_url):
    first = run(items_job_inprocess, db_url, config())
    (p,) = store.reports.list_pipelines()
    before = {n.name: n.output for n in store.pipelines.list_nodes(p.id)}
    crash_state(store, p.id)
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert reclaimed.reset_nodes == ("n3",)
    tags = {TAG_PIPELINE: str(p.id), TAG_RESUME_NUMBER: str(reclaimed.resume_number)}
    second = run(items_job_inprocess, db_url, config(), tags=tags)
    assert second.success
    assert call_counts(store) == {"n3": 2, "n4": 3}  # n1, n2 skipped; n3 redid items 1 and 2 only
    after = store.pipelines.get_pipeline(p.id)
    assert (after.status, after.owner, after.epoch) == ("completed", second.run_id, 2)
    assert {n.name: n.output for n in store.pipelines.list_nodes(p.id)} == before
    assert second.output_for_node("n2") == first.output_for_node("n2")  # downstream sees the recorded output
    n1_meta = second.events_for_node("n1")
    assert any("skipped: completed in run" in str(e.event_specific_data) for e in n1_meta)
    n3 = store.pipelines.get_node(p.id, "n3")
    assert n3.attempts == 2 and n3.run_id == second.run_id


def test_a_superseded_run_stops_without_writing(store, db_url):
    run(items_job_inprocess, db_url, config())
    (p,) = store.reports.list_pipelines()
    crash_state(store, p.id)
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    store.pipelines.attach(p.id, "the-real-resume", resume_number=reclaimed.resume_number)
    tags = {TAG_PIPELINE: str(p.id), TAG_RESUME_NUMBER: str(reclaimed.resume_number)}
    with pytest.raises(RecoveryError, match="owned by the-real-resume"):
        run(items_job_inprocess, db_url, config(), tags=tags)  # refused at run start, before any step
    assert call_counts(store) == {}
    assert store.pipelines.get_node(p.id, "n3").status == "pending"


def test_transient_errors_are_retried_in_run_and_the_node_completes(store, db_url, httpserver):
    for status in (503, 429):
        httpserver.expect_ordered_request("/fault").respond_with_data("busy", status=status)
    httpserver.expect_ordered_request("/fault").respond_with_data("ok", status=200)
    result = run(items_job_inprocess, db_url, config(1, n2={"fault_url": httpserver.url_for("/fault")}))
    assert result.success
    (p,) = store.reports.list_pipelines()
    n2 = store.pipelines.get_node(p.id, "n2")
    assert n2.status == "completed" and n2.attempts == 3
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 2


def test_permanent_error_fails_with_context_and_no_secret_anywhere(store, db_url, httpserver):
    httpserver.expect_request("/fault").respond_with_data("rejected api_key=sk-secret-123456789", status=401)
    url = httpserver.url_for("/fault")
    result = run(items_job_inprocess, db_url, config(1, n2={"fault_url": url}))
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    text = str(failure.event_specific_data.error)
    assert "auth HTTP 401 model=test-model endpoint=" in text and "sk-secret" not in text
    assert failure.event_specific_data.user_failure_data.metadata["category"].value == "auth"
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "failed"
    n2 = store.pipelines.get_node(p.id, "n2")
    assert (n2.status, n2.error_category, n2.error_status_code) == ("failed", "auth", 401)
    with store.read() as conn:
        dumped = " ".join(str(r) for t in (pipelines, nodes, events) for r in conn.execute(select(t)))
    assert "sk-secret" not in dumped and "401" in dumped


def test_optional_node_failure_degrades_and_the_pipeline_completes(store, db_url, httpserver):
    httpserver.expect_request("/fault").respond_with_data("down", status=503)
    cfg = {"ops": {"n1": {"config": {"items": 1, "item_seconds": 0.0}},
                   "optional_node": {"config": {"items": 1, "item_seconds": 0.0,
                                                "fault_url": httpserver.url_for("/fault")}}}}
    result = run(optional_job, db_url, cfg, max_retries=1, outage_pause_initial=0.05, outage_pause_max=0.1,
                 outage_budget_seconds=0.5)
    assert result.success
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"
    opt = store.pipelines.get_node(p.id, "optional_node")
    assert (opt.status, opt.error_category, opt.error_status_code) == ("degraded", "server_error", 503)


def test_the_same_transient_error_again_and_again_pauses_the_pipeline_until_the_outage_budget(store, db_url,
                                                                                              httpserver):
    httpserver.expect_request("/fault").respond_with_data("busy", status=503)
    result = run(items_job_inprocess, db_url, config(1, n2={"fault_url": httpserver.url_for("/fault")}),
                 max_retries=2, same_error_limit=3, outage_pause_initial=0.05, outage_pause_max=0.2,
                 outage_budget_seconds=4.0)  # room for more than 3 retries on a busy machine (pauses of <= 0.2 s)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "used up the outage budget of 4 s" in str(failure.event_specific_data.error)
    retries = len([e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"])
    assert retries > 3  # seed 002's escalation after 3 no longer fails: the node keeps pausing
    (p,) = store.reports.list_pipelines()
    assert (
        store.pipelines.get_pipeline(p.id).status == "failed"
        and store.pipelines.get_node(p.id, "n2").attempts == retries + 1
    )
    kinds = [e["kind"] for e in store.reports.recent_events(limit=1000)]
    assert kinds.count("pipeline_waiting") == retries - 2  # two plain retries, then one pause per retry


def test_a_node_pause_longer_than_the_outage_budget_is_cut_to_it(store, db_url, httpserver):
    """A pause of 30 s under a budget of 1 s waited the 30 s before it gave up. No pause runs past the budget now:
    the node tries once more when it is spent, then gives up."""
    httpserver.expect_request("/fault").respond_with_data("busy", status=503)
    result = run(items_job_inprocess, db_url, config(1, n2={"fault_url": httpserver.url_for("/fault")}),
                 max_retries=3, same_error_limit=1, outage_pause_initial=30.0, outage_pause_max=30.0,
                 outage_budget_seconds=1.0)
    assert not result.success
    waits = [e.event_specific_data.seconds_to_wait for e in result.all_events
             if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert waits and all(0 < wait <= 1.0 for wait in waits), waits
    (p,) = store.reports.list_pipelines()
    waiting = [t for t in store.reports.transitions_for(pipeline_id=p.id) if t["to_status"] == "waiting"]
    assert waiting and all("left of the outage budget" in t["data"]["reason"] for t in waiting), waiting
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "used up the outage budget of 1 s" in str(failure.event_specific_data.error)


def test_a_node_outage_that_ends_completes_and_the_pipeline_was_visibly_waiting(store, db_url, httpserver):
    seen = []

    def fault(request):
        seen.append(request)
        return Response("busy", status=503) if len(seen) <= 6 else Response("ok")

    httpserver.expect_request("/fault").respond_with_handler(fault)
    result = run(items_job_inprocess, db_url, config(1, n2={"fault_url": httpserver.url_for("/fault")}),
                 max_retries=2, same_error_limit=3, outage_pause_initial=0.05, outage_pause_max=0.2)
    assert result.success
    (p,) = store.reports.list_pipelines()
    p = store.pipelines.get_pipeline(p.id)
    assert p.status == "completed" and p.waiting_since is None and store.pipelines.get_node(p.id, "n2").attempts == 7
    waits = [t for t in store.reports.transitions_for(pipeline_id=p.id) if t["to_status"] == "waiting"]
    assert len(waits) == 4 and all("server_error errors in a row in n2" in t["data"]["reason"] for t in waits)



def test_a_recoverable_op_without_run_level_liveness_fails_loudly_and_writes_nothing(store, db_url):
    from dagster import in_process_executor, job

    unwrapped = job(name="unwrapped", executor_def=in_process_executor)(e2e_defs._graph)
    for attempt in (unwrapped, items_job_inprocess):  # Dagster's own execute_in_process swaps the executor too
        result = attempt.execute_in_process(run_config=config(), resources={"recovery": resource(db_url)},
                                            raise_on_error=False)
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        assert "does not keep its pipeline alive for the whole run" in str(failure.event_specific_data.error)
    assert store.reports.list_pipelines() == []
    assert not inspect(store.engine).has_table("e2e_calls")  # no business logic ran


def test_the_run_worker_resolves_the_recovery_resource_from_run_config_and_environment(monkeypatch, tmp_path):
    """A complete resource is used as given; EnvVar fields and run config are resolved as Dagster would."""
    from dagster import EnvVar, in_process_executor, job

    from recovery_ext._dagster.executor import resolve_resource

    @job(executor_def=in_process_executor)
    def empty():
        pass

    instance = DagsterInstance.ephemeral()
    complete = RecoveryResource(database_url=f"sqlite:///{tmp_path / 'a.db'}", heartbeat_interval=2.0)
    assert resolve_resource(empty, {}, instance, "recovery", complete) is complete
    monkeypatch.setenv("RX_TEST_DB_URL", f"sqlite:///{tmp_path / 'b.db'}")
    from_env = resolve_resource(
        empty, {}, instance, "recovery", RecoveryResource(database_url=EnvVar("RX_TEST_DB_URL"))
    )
    assert from_env.database_url == f"sqlite:///{tmp_path / 'b.db'}"
    configured = resolve_resource(empty, {"resources": {"recovery": {"config": {"heartbeat_interval": 3.0}}}},
                                  instance, "recovery", complete)
    assert configured is not complete and configured.heartbeat_interval == 3.0


FLAKY = {"url": ""}


def _ask_flaky(key: str) -> str:
    def get() -> str:
        response = httpx.get(FLAKY["url"], params={"key": key}, timeout=5)
        response.raise_for_status()
        return response.text

    return retrying(sleep=lambda seconds: None, max_attempts=10).call(get)


@pytest.mark.parametrize("where", ["body", "mapped_item"])
def test_a_body_s_own_retrying_that_escalates_a_busy_stretch_pauses_the_node_instead_of_failing_it(
        where, store, db_url, httpserver):
    """``retrying()`` makes a fifth 503 in a row a permanent EscalatedError, as seed 002 asks of code outside a node.
    Inside a recoverable node (its body, or an item of ``ctx.map``) that failed the pipeline for good after one busy
    stretch; the node escalates on its own (it retries, then pauses; only the outage budget gives up), so the
    escalation is undone there: the node retries and completes once the provider answers."""
    seen = []

    def answer(request):
        seen.append(request)
        return Response("busy", status=503) if len(seen) <= 6 else Response(f"ok {request.args['key']}")

    httpserver.expect_request("/flaky").respond_with_handler(answer)
    FLAKY["url"] = httpserver.url_for("/flaky")

    @recoverable_op
    def asks(ctx: NodeContext) -> int:
        if where == "body":
            for item in ctx.items(["only"]):
                item.complete(_ask_flaky(item.key))
        else:
            ctx.map(lambda item: _ask_flaky(item.key), ["only"], concurrency=1, retries=0)
        return len(ctx.completed_items())

    @recoverable_job(name=f"flaky_{where}", executor_def=in_process_executor)
    def flaky_job():
        asks()

    result = run(flaky_job, db_url, {}, same_error_limit=5, outage_pause_initial=0.05, outage_pause_max=0.1)
    assert result.success
    assert len(seen) == 7  # five, escalated and undone, then a retry of the node: one more 503 and the answer
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "completed"
    assert store.pipelines.completed_items(p.id, "asks") == {"only": "ok only"}



@recoverable_op
def first_of_two(ctx: NodeContext) -> int:
    return 1


@recoverable_op
def second_of_two(ctx: NodeContext, upstream: int) -> int:
    return upstream + 1


@recoverable_job(executor_def=in_process_executor)
def two_nodes_job():
    second_of_two(first_of_two())


def test_a_database_outage_as_a_node_begins_leaves_the_pipeline_to_recovery_not_failed(store, db_url, monkeypatch):
    """The store gave up on its database (past its retry budget) as the second node began, before its row moved to
    running; the database was back by the end of the run. Before: the run saw a failed step and no running node
    and failed the pipeline for good, although the step said it resumes once the database is back. Now the run
    leaves it to recovery, and the reclaim resumes it."""
    from recovery_ext._errors import StoreUnavailable
    from recovery_ext._store.pipelines import PipelineNodes

    begin_node = PipelineNodes.begin_node
    refused: list[str] = []

    def unavailable_once(self, run_id, name, **kwargs):
        if name == "second_of_two" and not refused:
            refused.append(name)
            raise StoreUnavailable("the database is unavailable: connection refused (a restart)")
        return begin_node(self, run_id, name, **kwargs)

    monkeypatch.setattr(PipelineNodes, "begin_node", unavailable_once)
    result = run(two_nodes_job, db_url, {})
    assert refused and not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "resumes once the database is back" in str(failure.event_specific_data.error)
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "running"
    assert [n.status for n in store.pipelines.list_nodes(p.id)] == ["completed", "pending"]
    (reclaimed,), _ = reclaim(store, PassPlan(limit=1, dead_owner_runs=[result.run_id], launching=True))
    assert reclaimed.pipeline_id == p.id
