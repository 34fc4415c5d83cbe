"""The call journal in the store and through a node (SQLite and PostgreSQL): the answer is kept, fenced by the
owner's epoch, before it is used; a later owner's same call gets it back and the ledger counts it saved; a
call whose answer never came shows as in flight at the crash; entries go when the pipeline ends."""

from __future__ import annotations

from dataclasses import replace

import pytest
from dagster import DagsterInstance, in_process_executor
from helpers import expire, incompressible_key, reclaim
from ledger_defs import llm_resource, recovery_resource
from stand_in_llm import StandInProvider

from recovery_ext import (
    ClassifiedError,
    ConfigurationError,
    NodeContext,
    ProviderCall,
    RetryPolicy,
    execute_in_process,
    journaled_call,
    provider_guard,
    record_provider_call,
    recoverable_job,
    recoverable_op,
)
from recovery_ext._errors import OwnershipLost
from recovery_ext._providers.journal import decode_answer, encode_answer, fingerprint
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import ItemCheckpoint, PassPlan
import store_rows
import contextlib

ENDPOINT = "http://127.0.0.1:9/v1"


def make(store, owner="run-1"):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner=owner, origin_run_id=owner, params={})
    store.pipelines.start_node(own, "a")
    return own


def started(own, item="k1", **kw):
    return ProviderCall(endpoint=ENDPOINT, model="m", outcome=IN_FLIGHT, pipeline_id=own.pipeline_id, node_name="a",
                        item_key=item, run_id=own.owner, epoch=own.epoch, **kw)


def take_over(store, own, run="run-2"):
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1))
    new = store.pipelines.attach(own.pipeline_id, run, resume_number=1)
    store.pipelines.start_node(new, "a")
    return new


def figures(store, pipeline_id):
    return store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]


def test_an_answer_kept_before_a_crash_is_replayed_to_the_next_owner_and_counted_saved(store):
    own = make(store)
    first = started(own)
    assert store.providers.journal_begin(own, first, call_key="fp#1") is None
    # before the answer: the ledger already has the call, in flight
    (row,) = store_rows.provider_calls(store, own.pipeline_id)
    assert (row.id, row.outcome) == (first.id, IN_FLIGHT)
    answered = ProviderCall(endpoint=ENDPOINT, model="m", tokens_in=40, tokens_out=9, latency_seconds=0.2,
                            cost=0.5, pipeline_id=own.pipeline_id, node_name="a", item_key="k1", run_id=own.owner,
                            epoch=own.epoch, id=first.id)
    store.providers.journal_answer(own, answered, call_key="fp#1", answer=encode_answer({"name": "Order"}))
    assert store_rows.call_journal_size(store, own.pipeline_id)[0] == 1
    # the worker dies before its item's checkpoint; the next owner asks the same
    new = take_over(store, own)
    with pytest.raises(OwnershipLost):
        store.providers.journal_begin(own, started(own), call_key="fp#1")  # the old worker sends nothing
    hit = store.providers.journal_begin(new, started(new), call_key="fp#1")
    assert hit is not None and decode_answer(hit.answer) == {"name": "Order"} and hit.call.id == first.id
    assert store.providers.journal_begin(new, started(new), call_key="fp#2") is None  # another call is a new request
    store.pipelines.checkpoint_item(new, "a", ItemCheckpoint("k1", {"name": "Order"}, calls=(hit.call,)))
    f = figures(store, own.pipeline_id)
    assert (f.calls, f.tokens_in, f.saved_calls, f.replayed_calls, f.wasted_calls) == (2, 40, 1, 1, 0)
    assert f.saved_cost == 0.5
    assert f.in_flight_unknown_calls == 0  # fp#2 is the live owner's request under way: open


def test_a_call_in_flight_at_a_crash_is_neither_lost_nor_wasted(store):
    own = make(store)
    lost = started(own)
    store.providers.journal_begin(own, lost, call_key="fp#1")
    f = figures(store, own.pipeline_id)
    assert (f.calls, f.in_flight_unknown_calls, f.wasted_calls) == (1, 0, 0)  # still under way
    new = take_over(store, own)
    f = figures(store, own.pipeline_id)
    assert (f.calls, f.in_flight_unknown_calls, f.wasted_calls, f.saved_calls) == (1, 1, 0, 0)
    # the superseded worker's answer arrives late: the journal refuses it, the ledger states what was paid
    late = ProviderCall(endpoint=ENDPOINT, tokens_in=7, tokens_out=3, pipeline_id=own.pipeline_id, node_name="a",
                        item_key="k1", run_id=own.owner, epoch=own.epoch, id=lost.id)
    with pytest.raises(OwnershipLost):
        store.providers.journal_answer(own, late, call_key="fp#1", answer=encode_answer("x"))
    assert store.providers.journal_begin(new, started(new), call_key="fp#1") is None  # nothing was kept
    store.providers.complete_calls([late])
    store.providers.complete_calls([ProviderCall(endpoint=ENDPOINT, tokens_in=99, id=lost.id)])  # completed once only
    f = figures(store, own.pipeline_id)
    assert (f.calls, f.tokens_in, f.in_flight_unknown_calls, f.wasted_calls) == (2, 7, 0, 1)


def test_entries_go_when_the_pipeline_completes_and_the_ledger_rows_stay(store):
    own = make(store)
    for i in range(3):
        c = started(own, item=f"k{i}")
        store.providers.journal_begin(own, c, call_key=f"fp{i}#1")
        store.providers.journal_answer(own, c, call_key=f"fp{i}#1", answer=encode_answer({"i": i, "text": "x" * 1000}))
    entries, chars = store_rows.call_journal_size(store, own.pipeline_id)
    assert entries == 3 and chars > 3000
    for i in range(3):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(f"k{i}", i))
    store.pipelines.complete_node(own, "a")
    assert store_rows.call_journal_size(store, own.pipeline_id)[0] == 3  # the pipeline is still running (node b)
    store.pipelines.start_node(own, "b")
    assert store.pipelines.complete_node(own, "b")
    assert store_rows.call_journal_size(store, own.pipeline_id) == (0, 0)
    assert len(store_rows.provider_calls(store, own.pipeline_id)) == 3
    assert store.providers.prune_call_journal() == 0


def test_prune_removes_what_a_trigger_could_not_and_keeps_a_failed_pipelines_entries(store):
    own = make(store)
    c = started(own)
    store.providers.journal_begin(own, c, call_key="fp#1")
    store.providers.journal_answer(own, c, call_key="fp#1", answer=encode_answer(1))
    store_rows.fail_pipeline(store, own.pipeline_id, "gave up")
    assert store.providers.prune_call_journal() == 0  # a redo may still use them
    assert store.providers.prune_call_journal(own.pipeline_id) == 1


def test_fingerprints_and_answers():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert fingerprint(object()) is None
    assert decode_answer(encode_answer({"x": [1, "y"]})) == {"x": [1, "y"]}
    assert encode_answer(object()) is None


# -- through a node ------------------------------------------------------------------------------

@recoverable_op(required_resource_keys={"llm"})
def ask_twice(ctx: NodeContext) -> dict:
    """Two calls per item; the first answers are asked again with fresh=True on a 'fresh' item."""
    llm = ctx.context.resources.llm.enricher(ctx)
    out = {}
    for item in ctx.items(["orders", "fresh"]):
        entity = llm.complete_json("describe_entity", {"table": item.key, "columns": []})
        again = llm.complete_json("describe_entity", {"table": item.key, "columns": []}, fresh=item.key == "fresh")
        out[item.key] = [entity, again]
        item.complete(entity)
    return out


@recoverable_op
def by_hand(ctx: NodeContext) -> dict:
    """Any client: journaled_call around its own request, with an idempotency key and a refused bad key."""
    sent = []

    def send():
        sent.append(1)
        record_provider_call(ProviderCall(endpoint=ENDPOINT, model="m", tokens_in=3, tokens_out=2))
        return {"n": len(sent)}

    for item in ctx.items(["only"]):
        first = journaled_call(send, endpoint=ENDPOINT, key="order-17")
        second = journaled_call(send, endpoint=ENDPOINT, key="order-17")  # the second occurrence: its own call
        with contextlib.suppress(ConfigurationError):
            journaled_call(send, endpoint=ENDPOINT, key="")
        item.complete([first, second])
    return {"sent": len(sent)}


def test_a_node_journals_each_call_and_fresh_asks_again(store, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)

    @recoverable_job(name="journal_job", executor_def=in_process_executor)
    def journal_job():
        ask_twice()
        by_hand()

    with StandInProvider() as provider, DagsterInstance.ephemeral() as instance:
        result = execute_in_process(journal_job, instance=instance,
                                    resources={"recovery": recovery_resource(), "llm": llm_resource(provider.url)})
        assert result.success
        assert len(provider.calls) == 4  # two calls per item, each a request (fresh or a second occurrence)
    (pipeline,) = store.reports.list_pipelines()
    calls = store_rows.provider_calls(store, pipeline.id)
    assert len(calls) == 6 and all(c.outcome == "ok" for c in calls)
    assert sum(c.tokens_in for c in calls) == provider.totals()["tokens_in"] + 6
    assert result.output_for_node("by_hand") == {"sent": 2}
    assert store_rows.call_journal_size(store, pipeline.id) == (0, 0)  # the pipeline completed: pruned
    assert all(store_rows.reached_checkpoint(store, [c.id for c in calls]).values())


def test_outside_a_node_the_journal_is_just_the_call():
    assert journaled_call(lambda: 41 + 1, endpoint=ENDPOINT, request={"q": 1}) == 42


def test_a_re_execution_that_takes_over_replays_the_answer_and_fences_the_old_worker(store):
    own = make(store)
    first = started(own)
    store.providers.journal_begin(own, first, call_key="fp#1")
    store.providers.journal_answer(
        own, replace(first, outcome="ok", tokens_in=5), call_key="fp#1", answer=encode_answer([1])
    )
    pending = started(own, item="k2")
    store.providers.journal_begin(own, pending, call_key="fp2#1")  # in flight when the run failed
    new = store.pipelines.take_over(own.pipeline_id, "run-2", owner_dead=[own.owner])
    store.pipelines.start_node(new, "a")
    with pytest.raises(OwnershipLost):
        store.providers.journal_answer(own, replace(pending, outcome="ok"), call_key="fp2#1", answer=encode_answer([2]))
    hit = store.providers.journal_begin(new, started(new), call_key="fp#1")
    assert hit is not None and decode_answer(hit.answer) == [1]
    assert (
        store.providers.journal_begin(new, started(new, item="k2"), call_key="fp2#1") is None
    )  # not kept: asked again
    store.pipelines.checkpoint_item(new, "a", ItemCheckpoint("k1", [1], calls=(hit.call,)))
    f = figures(store, own.pipeline_id)
    assert (f.calls, f.saved_calls, f.replayed_calls, f.in_flight_unknown_calls, f.wasted_calls) == (3, 1, 1, 1, 0)


def test_costs_shows_replayed_answers_as_saved_and_in_flight_calls_apart(store, db_url):
    import json

    from click.testing import CliRunner

    from recovery_ext._cli import main

    own = make(store)
    c = started(own)
    store.providers.journal_begin(own, c, call_key="fp#1")
    store.providers.journal_answer(
        own, replace(c, outcome="ok", tokens_in=4), call_key="fp#1", answer=encode_answer("a")
    )
    store.providers.journal_begin(own, started(own, item="k2"), call_key="fp2#1")  # in flight at the crash
    new = take_over(store, own)
    hit = store.providers.journal_begin(new, started(new), call_key="fp#1")
    store.pipelines.checkpoint_item(new, "a", ItemCheckpoint("k1", "a", calls=(hit.call,)))
    shown = CliRunner().invoke(main, ["--database-url", db_url, "costs", str(own.pipeline_id), "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert (data["calls"], data["saved_calls"], data["replayed_calls"], data["in_flight_unknown_calls"],
            data["wasted_calls"]) == (2, 1, 1, 1, 0)
    table = CliRunner().invoke(main, ["--database-url", db_url, "costs", str(own.pipeline_id)])
    assert "replayed" in table.stdout and "in flight at a crash (unknown)" in table.stdout


ASKED: list[str] = []


def ask(question: str) -> dict:
    ASKED.append(question)
    return {"answer": question.upper()}


@recoverable_op
def guarded(ctx: NodeContext) -> int:
    """provider_guard journals by default: the step's retry gets the answer its first attempt paid for."""
    guard = provider_guard(ctx, ENDPOINT, RetryPolicy(initial_delay=0.01, max_delay=0.02))
    for item in ctx.items(["x", "y"]):
        answer = guard.call(ask, item.key)
        if item.key == "y" and ctx.context.retry_number == 0:
            raise ClassifiedError(category="server", retryable=True, message="failed after the answer arrived")
        item.complete(answer)
    return len(ASKED)


def run_one_op(op_def, db_url, monkeypatch):
    """A recoverable job of ``op_def`` alone, run in this process on ``db_url``."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)

    @recoverable_job(name=f"{op_def.name}_job", executor_def=in_process_executor)
    def one_op_job():
        op_def()

    with DagsterInstance.ephemeral() as instance:
        return execute_in_process(one_op_job, instance=instance, resources={"recovery": recovery_resource()})


def test_the_guard_journals_by_default_and_a_step_retry_does_not_pay_again(store, db_url, monkeypatch):
    ASKED.clear()
    result = run_one_op(guarded, db_url, monkeypatch)
    assert result.success
    assert ASKED == ["x", "y"]  # y was answered once; the retry replayed it
    (pipeline,) = store.reports.list_pipelines()
    calls = store_rows.provider_calls(store, pipeline.id)
    assert len(calls) == 2 and {c.outcome for c in calls} == {"ok"}
    from sqlalchemy import select

    from recovery_ext._store.schema import provider_calls

    with store.read() as conn:
        replays = dict(conn.execute(select(provider_calls.c.item_key, provider_calls.c.replays)).all())
    assert replays == {"x": 0, "y": 1}


def test_a_node_builds_its_journal_and_recorder_once_and_only_when_a_call_needs_them(store):
    import threading

    from dagster import build_op_context

    from recovery_ext._liveness.heartbeat import HeartbeatSettings

    own = make(store)
    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        for item in ctx.items(["x", "y"], batch=2):
            item.complete({"k": item.key})
        assert ctx._journal is None  # two items checkpointed without a call: no journal built, none reset
        assert store.pipelines.completed_items(own.pipeline_id, "a") == {"x": {"k": "x"}, "y": {"k": "y"}}
        start, seen = threading.Barrier(8), []

        def first_use():
            start.wait()
            seen.append(ctx.journal)

        threads = [threading.Thread(target=first_use) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(seen) == 8 and len({id(journal) for journal in seen}) == 1 and ctx._journal is seen[0]
        assert ctx._recorder is None  # nor the ledger's recorder: this node recorded no call
        assert ctx.flush_ledger() is True
        ctx.record_call(ProviderCall(endpoint=ENDPOINT, model="m", tokens_in=1, tokens_out=1), item="x")
        assert ctx._recorder is not None and ctx.flush_ledger() is True
        (call,) = store_rows.provider_calls(store, own.pipeline_id)
        assert (call.item_key, call.tokens_in) == ("x", 1)


@recoverable_op
def odd_journal_keys(ctx: NodeContext) -> dict:
    """ctx.checkpoint's style: the op names each call's item itself, here from text decoded from bytes that are
    not UTF-8 (and a NUL, which PostgreSQL's text refuses), and once as the idempotency key; then a key too long for
    PostgreSQL's index."""
    sent, refused = [], []

    def send():
        sent.append(1)
        return {"n": len(sent)}

    for key in ["scan-\udcff.png", "page\x00two"]:
        for kwargs in ({"item": key, "request": {"q": 1}}, {"key": key}):
            try:
                journaled_call(send, endpoint=ENDPOINT, **kwargs)
            except ConfigurationError as exc:
                refused.append(str(exc))
    try:  # longer than PostgreSQL's index entry holds (an idempotency key has 200 characters at most)
        journaled_call(send, endpoint=ENDPOINT, item=incompressible_key(4000), request={"q": 1})
    except ConfigurationError as exc:
        refused.append(str(exc))
    answer = journaled_call(send, endpoint=ENDPOINT, item="fine", request={"q": 1})  # the node goes on
    ctx.checkpoint("fine", answer)
    return {"sent": len(sent), "refused": refused}


def test_a_journaled_call_for_a_key_the_journal_cannot_store_is_refused_before_its_request(store, db_url,
                                                                                            monkeypatch):
    result = run_one_op(odd_journal_keys, db_url, monkeypatch)
    assert result.success
    out = result.output_for_node("odd_journal_keys")
    sqlite = store.dialect.text_keeps_nul  # SQLite's text keeps a NUL and a long key: three calls more are sent
    assert out["sent"] == (4 if sqlite else 1)  # the plain key's request left, and no refused one
    assert len(out["refused"]) == (2 if sqlite else 5) and all(
        "could not store it, so no request was sent" in why for why in out["refused"])
    assert "a journaled call's item key 'scan-\\udcff.png' holds a lone surrogate" in out["refused"][0]
    assert "a journaled call's idempotency key 'scan-\\udcff.png'" in out["refused"][1]
    if not sqlite:
        assert "is 4,000 bytes of UTF-8 that do not compress to the 2,500 a key may take" in out["refused"][-1]
