"""Items worked in parallel inside one recoverable node: ``ctx.map`` in threads, ``await ctx.amap`` in asyncio
tasks, ``async for ... ctx.aitems`` in an ``async def`` body, on SQLite and PostgreSQL, against a real local
stand-in provider that counts what it is paid for.

Each item's call must belong to that item: its ledger row names it, and an item retried after its answer
arrived gets that answer back from the journal (the stand-in is paid once) and checkpoints it as its own.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter

import pytest

import parallel_defs
import store_rows
from echo_provider import EchoProvider
from sdk_stand_in import SdkStandIn
from helpers import reclaim_until_taken
from recovery_ext import RecoveryResource, execute_in_process
from recovery_ext._store.models import PassPlan
from recovery_ext._store.models import deployment_scope, pipeline_scope
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.devserver import wait_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def provider():
    with EchoProvider(latency=0.15) as running:
        yield running


def recovery(db_url: str, **kw) -> RecoveryResource:
    settings = dict(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=5, max_retries=2,
                    retry_initial_delay=0.01, retry_max_delay=0.02)
    settings.update(kw)
    return RecoveryResource(**settings)


def run(job, db_url: str, node: str, instance=None, **config):
    return execute_in_process(job, run_config={"ops": {node: {"config": config}}}, instance=instance,
                              resources={"recovery": recovery(db_url)}, raise_on_error=False)


def take_over(store, pipeline):
    """Reclaim ``pipeline`` as the orphan sensor does, tick after tick until it is taken: a pass skips a pipeline
    whose row a fenced write holds at that instant (``FOR UPDATE SKIP LOCKED``), and a busy op's group commits
    often do."""
    return reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]),
                               what=f"the take-over of pipeline {pipeline.id}")


def only_pipeline(store):
    (pipeline,) = store.reports.list_pipelines()
    return pipeline


def assert_each_item_got_its_own_answer(store, node: str, keys: list[str], provider: EchoProvider) -> None:
    pipeline = only_pipeline(store)
    results = store.pipelines.completed_items(pipeline.id, node)
    assert sorted(results) == keys
    for key, result in results.items():
        assert result == {"key": key, "answer": f"answer-{key}", "asked_for": key}
    paid = [c for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == "ok"]
    assert Counter(c.item_key for c in paid) == Counter(keys)  # one paid call per item, recorded as that item's
    assert all(c.tokens_in == 10 and c.tokens_out == 5 for c in paid)
    assert provider.paid == Counter(keys)


def test_amap_without_await_fails_the_node_instead_of_completing_it_with_no_item_worked(store, db_url, provider):
    """``ctx.amap(...)`` without ``await`` makes a coroutine that never runs: the node fails for good, naming the
    slip, rather than completing as if its items were done (Python only warns when the coroutine is collected)."""
    with pytest.warns(RuntimeWarning, match="never awaited"):
        result = run(parallel_defs.unawaited_job, db_url, "unawaited", url=provider.url, keys=3)
        gc.collect()
    assert not result.success
    assert "node unawaited called ctx.amap(...) without `await`, so none of its items was worked" in \
        result.failure_data_for_node("unawaited").error.message
    assert provider.paid == Counter()
    pipeline = only_pipeline(store)
    assert store.pipelines.get_node(pipeline.id, "unawaited").status != "completed" and pipeline.status != "completed"
    # what the body finished before the slip is kept: its buffered completions are flushed before the node fails
    assert store.pipelines.completed_items(pipeline.id, "unawaited") == {"kept-1": {"kept": "kept-1"},
                                                                        "kept-2": {"kept": "kept-2"}}


@pytest.mark.parametrize("job, node", [(parallel_defs.threaded_job, "threaded"),
                                       (parallel_defs.tasks_job, "tasks")])
def test_items_in_parallel_each_keep_their_own_calls_and_answers(store, db_url, provider, job, node):
    keys = [f"k{i:05d}" for i in range(24)]
    flaky = keys[3:9]  # these fail once after their answer arrived: the retry must replay, not pay again
    result = run(job, db_url, node, url=provider.url, keys=24, concurrency=8, flaky=flaky)
    assert result.success, result.all_events
    assert result.output_for_node(node) == {"done": 24, "resumed": 0}
    assert 2 <= provider.peak <= 8  # worked in parallel, never more at once than asked
    assert_each_item_got_its_own_answer(store, node, keys, provider)
    pipeline = only_pipeline(store)
    assert pipeline.status == "completed"
    assert store_rows.replays_by_item(store, pipeline.id, node) == {key: 1 for key in flaky}


def test_an_async_body_iterates_its_items_and_checkpoints_without_blocking(store, db_url, provider):
    keys = [f"k{i:05d}" for i in range(6)]
    result = run(parallel_defs.sequential_async_job, db_url, "sequential_async", url=provider.url, keys=6)
    assert result.success
    assert result.output_for_node("sequential_async") == {"done": 6}
    assert provider.peak == 1
    assert_each_item_got_its_own_answer(store, "sequential_async", keys, provider)


def test_an_async_asset_maps_its_items_in_tasks(store, db_url, provider, instance):
    defs = parallel_defs.asset_definitions(recovery(db_url))
    result = execute_in_process(defs.resolve_job_def("summaries_job"), instance=instance,
                                run_config={"ops": {"summaries": {"config": {"url": provider.url, "keys": 12,
                                                                             "concurrency": 4}}}})
    assert result.success
    assert result.asset_value("summaries") == {"done": 12}
    assert 2 <= provider.peak <= 4
    assert_each_item_got_its_own_answer(store, "summaries", [f"k{i:05d}" for i in range(12)], provider)


def test_a_failing_item_fails_alone_and_the_rerun_redoes_only_it(store, db_url):
    keys = [f"k{i:05d}" for i in range(10)]
    with EchoProvider(latency=0.05, fail={"k00004": [400] * 3}) as provider:
        first = run(parallel_defs.threaded_job, db_url, "threaded", url=provider.url, keys=10, concurrency=4)
        assert not first.success
        failure = first.failure_data_for_node("threaded")
        assert "1 item(s) of node threaded failed" in failure.error.message
        assert "k00004" in failure.error.message
        pipeline = only_pipeline(store)
        done = store.pipelines.completed_items(pipeline.id, "threaded")
        assert sorted(done) == [k for k in keys if k != "k00004"]  # its siblings finished and checkpointed
        assert provider.refused == Counter({"k00004": 1})  # a 400 is permanent: not retried
        assert provider.paid == Counter({k: 1 for k in keys if k != "k00004"})


def test_a_result_that_is_not_json_fails_its_item_with_a_clear_error_and_keeps_the_others(store, db_url, provider):
    result = run(parallel_defs.threaded_job, db_url, "threaded", url=provider.url, keys=6, concurrency=3,
                 bad_result=["k00002"])
    assert not result.success
    message = result.failure_data_for_node("threaded").error.message
    assert "k00002" in message and "JSON-serializable" in message
    pipeline = only_pipeline(store)
    assert len(store.pipelines.completed_items(pipeline.id, "threaded")) == 5


@pytest.mark.parametrize("concurrency", [0, -3])
def test_a_concurrency_below_one_is_refused_before_any_call(store, db_url, provider, concurrency):
    result = run(parallel_defs.threaded_job, db_url, "threaded", url=provider.url, keys=3, concurrency=concurrency)
    assert not result.success
    assert "ctx.map(concurrency=...) must be a whole number from 1" in \
        result.failure_data_for_node("threaded").error.message
    assert provider.paid == Counter()


@pytest.mark.parametrize("job, node, name", [(parallel_defs.threaded_job, "threaded", "ctx.map"),
                                             (parallel_defs.tasks_job, "tasks", "ctx.amap")])
def test_a_key_given_twice_is_refused_before_any_call(store, db_url, provider, job, node, name):
    result = run(job, db_url, node, url=provider.url, keys=4, concurrency=2, repeat_key="k00001")
    assert not result.success
    assert f"{name}: key 'k00001' is given twice; each item needs a key of its own" in \
        result.failure_data_for_node(node).error.message
    assert provider.paid == Counter()
    assert store.pipelines.completed_items(only_pipeline(store).id, node) == {}


@pytest.mark.parametrize("job, node, name", [(parallel_defs.threaded_job, "threaded", "ctx.map"),
                                             (parallel_defs.tasks_job, "tasks", "ctx.amap")])
def test_a_key_no_checkpoint_could_store_is_refused_before_any_call(store, db_url, provider, job, node, name):
    """A lone surrogate (a file name that is not UTF-8) has no text form on either database (NUL characters:
    tests/store/test_checkpoint_keys.py, by database)."""
    result = run(job, db_url, node, url=provider.url, keys=4, concurrency=2, odd_key="surrogate")
    assert not result.success
    message = result.failure_data_for_node(node).error.message
    assert f"{name}: key 'scan-\\udcff.png' holds a lone surrogate" in message and "no item was started" in message
    assert provider.paid == Counter()
    assert store.pipelines.completed_items(only_pipeline(store).id, node) == {}


def test_a_sync_function_given_to_amap_is_refused_clearly(store, db_url, provider):
    result = run(parallel_defs.wrong_kind_job, db_url, "wrong_kind", url=provider.url, keys=3)
    assert not result.success
    assert "ctx.amap: the item function must be an `async def` function" in \
        result.failure_data_for_node("wrong_kind").error.message


@pytest.mark.parametrize("job, node", [(parallel_defs.threaded_job, "threaded"),
                                       (parallel_defs.tasks_job, "tasks")])
def test_a_superseded_op_sends_no_new_request_from_any_of_its_items(store, db_url, job, node):
    """Every request first writes its in-flight ledger row, fenced by the epoch: once the take-over commits, at
    most the requests already past that fence (one per item in flight) reach the provider."""
    concurrency = 4
    with EchoProvider(latency=0.3) as provider:
        outcome = {}
        runner = threading.Thread(target=lambda: outcome.setdefault("result", run(
            job, db_url, node, url=provider.url, keys=60, concurrency=concurrency)))
        runner.start()
        wait_for(lambda: len(provider.arrivals) >= 8, timeout=60)
        pipeline = only_pipeline(store)
        take_over(store, pipeline)
        taken_over = time.monotonic()
        runner.join(120)
        assert not runner.is_alive()
        result = outcome["result"]
        assert not result.success
        assert "superseded" in result.failure_data_for_node(node).error.message
        late = [item for at, item in provider.arrivals if at > taken_over]
        assert len(late) <= concurrency, late
        assert len(provider.arrivals) < 60


def test_a_take_over_wrapped_by_the_sdk_still_stops_every_task(store, db_url):
    """The OpenAI SDK wraps what its transport raises (APIConnectionError): the op still stops as superseded and
    no task sends past the fence."""
    concurrency = 4
    latency = 0.3
    stand_in = SdkStandIn(latency=latency)
    url = stand_in.start() + "/v1"
    try:
        outcome = {}
        runner = threading.Thread(target=lambda: outcome.setdefault("result", run(
            parallel_defs.sdk_tasks_job, db_url, "sdk_tasks", url=url, keys=60, concurrency=concurrency,
            retries=0)))
        runner.start()
        wait_for(lambda: len(stand_in.requests) >= 8, timeout=60)
        pipeline = only_pipeline(store)
        take_over(store, pipeline)
        taken_over = time.time()
        runner.join(120)
        assert not runner.is_alive()
        result = outcome["result"]
        assert not result.success
        assert "superseded" in result.failure_data_for_node("sdk_tasks").error.message
        late = [r for r in stand_in.requests if r.at - latency > taken_over]
        assert len(late) <= concurrency, late
        assert len(stand_in.requests) < 60
    finally:
        stand_in.stop()


def _sdk_tasks_under_a_cap(db_url: str, cap: int, **config) -> tuple[threading.Thread, dict]:
    """sdk_tasks_job started in a thread under a spend cap of ``cap`` tokens (looked at every 0.2 s); the thread
    and where its result goes."""
    outcome: dict = {}
    resource = recovery(db_url, spend_cap_tokens=cap, spend_cap_poll_seconds=0.2)
    runner = threading.Thread(target=lambda: outcome.setdefault("result", execute_in_process(
        parallel_defs.sdk_tasks_job, run_config={"ops": {"sdk_tasks": {"config": config}}},
        resources={"recovery": resource}, raise_on_error=False)))
    runner.start()
    return runner, outcome


def test_sdk_requests_in_parallel_pause_at_the_spend_cap_and_go_on_when_it_is_raised(store, db_url):
    """Every request through the journaling transport reserves under the pipeline's spend cap first: four tasks
    stop at the cap (the pipeline waits, never fails), and go on once an operator raises it."""
    cap = 200
    stand_in = SdkStandIn(latency=0.05)
    url = stand_in.start() + "/v1"
    try:
        runner, outcome = _sdk_tasks_under_a_cap(db_url, cap, url=url, keys=12, concurrency=4)

        def paused():
            found = store.reports.list_pipelines()
            return found and found[0].shown_status == WAITING and found[0].waiting_reason.startswith("spend cap")

        wait_for(paused, timeout=120, interval=0.05)
        spent = sum(r.tokens_in + r.tokens_out for r in stand_in.answered())
        assert 0 < spent <= cap and len(stand_in.answered()) < 12
        (pipeline,) = store.reports.list_pipelines()
        store.providers.spend_cap_set(pipeline_scope(pipeline.id), tokens=100_000)
        runner.join(120)
        assert not runner.is_alive()
        assert outcome["result"].success
        assert len(store.pipelines.completed_items(pipeline.id, "sdk_tasks")) == 12
        capped = store.providers.spend_cap(pipeline_scope(pipeline.id))
        assert capped.spent_tokens == sum(r.tokens_in + r.tokens_out for r in stand_in.answered())
        assert capped.reserved_tokens == 0
    finally:
        stand_in.stop()


def test_a_cap_an_operator_set_holds_a_pipeline_whose_configuration_has_none(store, db_url):
    """`recovery-ext spend-cap set --deployment` on a deployment whose jobs configure no cap: a new user's trial found
    `set` refused any scope without a cap. Now the cap is made, and a pipeline of that deployment whose
    configuration names none finds it at its node's first call (a worker thread's read, not the event loop's):
    its tasks pause at it, never fail, and go on once the operator raises it."""
    cap = 200
    deployment = "capped"
    earlier = store.pipelines.create_pipeline("earlier", ["a"], owner="run-0", deployment=deployment)  # it exists
    store.providers.spend_cap_set(deployment_scope(deployment), tokens=cap)
    stand_in = SdkStandIn(latency=0.05)
    url = stand_in.start() + "/v1"
    try:
        outcome: dict = {}
        resource = recovery(db_url, spend_cap_poll_seconds=0.2, deployment=deployment)  # no spend_cap_* of its own
        assert not resource.spend_caps().enabled
        runner = threading.Thread(target=lambda: outcome.setdefault("result", execute_in_process(
            parallel_defs.sdk_tasks_job, run_config={"ops": {"sdk_tasks": {"config": {
                "url": url, "keys": 12, "concurrency": 4}}}},
            resources={"recovery": resource}, raise_on_error=False)))
        runner.start()

        def paused():
            found = [p for p in store.reports.list_pipelines() if p.id != earlier.pipeline_id]
            return found and found[0].shown_status == WAITING and found[0].waiting_reason.startswith("spend cap")

        wait_for(paused, timeout=120, interval=0.05)
        assert 0 < sum(r.tokens_in + r.tokens_out for r in stand_in.answered()) <= cap
        assert len(stand_in.answered()) < 12
        store.providers.spend_cap_set(deployment_scope(deployment), tokens=100_000)
        runner.join(120)
        assert not runner.is_alive()
        assert outcome["result"].success
        capped = store.providers.spend_cap(deployment_scope(deployment))
        assert capped.spent_tokens == sum(r.tokens_in + r.tokens_out for r in stand_in.answered())
        assert capped.reserved_tokens == 0
    finally:
        stand_in.stop()


def test_more_sdk_tasks_waiting_at_the_spend_cap_than_the_loop_has_worker_threads_let_the_others_finish(
        store, db_url):
    """32 tasks, each reserving its request's estimate (100 tokens asked at most) under a 2,000-token cap: about 18
    hold room and the rest wait at the cap, more than the event loop's worker threads (6 on 2 cores). A wait
    holds no thread, so the holders' store writes run, their answers (about 20 tokens each) settle, and every
    item is done under the cap; the node shows its tasks' waits as one pause, not one per task."""
    cap = 2000
    stand_in = SdkStandIn(latency=0.1)
    url = stand_in.start() + "/v1"
    try:
        runner, outcome = _sdk_tasks_under_a_cap(db_url, cap, url=url, keys=50, concurrency=32, max_tokens=100)
        runner.join(120)
        assert not runner.is_alive(), "the node waited at the spend cap for ever"
        result = outcome["result"]
        assert result.success
        (pipeline,) = store.reports.list_pipelines()
        assert len(store.pipelines.completed_items(pipeline.id, "sdk_tasks")) == 50
        assert len(stand_in.answered()) == 50
        capped = store.providers.spend_cap(pipeline_scope(pipeline.id))
        assert capped.spent_tokens == sum(r.tokens_in + r.tokens_out for r in stand_in.answered()) <= cap
        assert capped.reserved_tokens == 0
        kinds = [e["kind"] for e in store.reports.recent_events() if e.get("pipeline_id") == pipeline.id]
        # tasks waited at the cap, shown as one pause of the node (not one per task), and every pause ended
        assert kinds.count("pipeline_waiting") == kinds.count("pipeline_waiting_over") >= 1, kinds
    finally:
        stand_in.stop()


def test_a_thread_starts_its_next_item_while_its_checkpoint_commits_and_queues_two_at_most(store, db_url, provider,
                                                                                              monkeypatch):
    """ctx.map does not hold a thread while an item's checkpoint commits (the next item starts), but a thread
    waits for it once the next one is queued: at most two checkpoints queued per thread (the one committing and
    the next), and every item checkpointed once when the map returns. The first commits are held until every
    thread's second item has returned: that happens only if threads go on while their checkpoints commit, and
    then each thread has both of its checkpoints queued."""
    from recovery_ext._dagster import parallel
    from recovery_ext._dagster.group_commit import GroupCommitter
    from recovery_ext._store.models import ItemCheckpoint
    from recovery_ext._store.store import Pipelines

    queued: set[int] = set()
    most = [0]
    returned = [0]
    lock = threading.Lock()
    second_items_returned = threading.Event()
    submit, run_item, checkpoint_items = GroupCommitter.submit, parallel._run_item, Pipelines.checkpoint_items

    def counting(self, entry):
        done = submit(self, entry)
        if isinstance(entry, ItemCheckpoint):
            with lock:
                queued.add(id(done))
                most[0] = max(most[0], len(queued))

            def settled(_):
                with lock:
                    queued.discard(id(done))

            done.add_done_callback(settled)
        return done

    def counted(node, item, fn, attempts):
        def one(it):
            answer = fn(it)
            with lock:
                returned[0] += 1
                if returned[0] >= 8:  # 4 threads, each on its second item: their first checkpoints are held
                    second_items_returned.set()
            return answer
        return run_item(node, item, one, attempts)

    def held(self, *args, **kwargs):
        second_items_returned.wait(timeout=60)
        return checkpoint_items(self, *args, **kwargs)

    monkeypatch.setattr(GroupCommitter, "submit", counting)
    monkeypatch.setattr(parallel, "_run_item", counted)
    monkeypatch.setattr(Pipelines, "checkpoint_items", held)
    result = run(parallel_defs.threaded_job, db_url, "threaded", url=provider.url, keys=40, concurrency=4)
    assert result.success, result.all_events
    assert second_items_returned.is_set()
    assert result.output_for_node("threaded") == {"done": 40, "resumed": 0}
    # each thread had its first checkpoint held and its second queued (the last thread's second may only just
    # be queued as the first commits go), and never a third
    assert 4 < most[0] <= 2 * 4 and not queued
    assert_each_item_got_its_own_answer(store, "threaded", [f"k{i:05d}" for i in range(40)], provider)


def test_a_permanent_failure_past_the_named_ones_still_fails_the_node_for_good(store, db_url, monkeypatch):
    """A map names its first NAMED_FAILURES failed items (1,000; 2 here). Before: only those decided whether
    ItemsFailed was permanent, so a permanent failure after a thousand transient ones was retried and paused on
    until the outage budget. Now any permanent failure makes it permanent: the node fails at once."""
    from recovery_ext._dagster import parallel

    monkeypatch.setattr(parallel, "NAMED_FAILURES", 2)
    with EchoProvider(latency=0.0, fail={"k00000": [503] * 100, "k00001": [503] * 100, "k00002": [400]}) as provider:
        result = execute_in_process(
            parallel_defs.threaded_job, raise_on_error=False,
            run_config={"ops": {"threaded": {"config": {"url": provider.url, "keys": 3, "concurrency": 1}}}},
            resources={"recovery": recovery(db_url, outage_pause_initial=0.05, outage_pause_max=0.1,
                                            outage_budget_seconds=2.0)})
    assert not result.success
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]  # no retry, no pause
    node = store.pipelines.get_node(only_pipeline(store).id, "threaded")
    assert (node.status, node.error_category) == ("failed", "validation")
    assert "failed for good past those named" in node.error and "400" in node.error, node.error
    assert provider.refused["k00002"] == 1
