"""A journaled provider call's two fenced writes: one server-side call each on PostgreSQL, the same rows and
the same refusals as the transaction SQLite runs. Store tests run on both databases."""

from __future__ import annotations

from functools import partial

import pytest
from helpers import drop_answers_once, expire, reclaim, round_trips, sent_round_trips
from sqlalchemy import select

from recovery_ext._errors import NotFound, OwnershipLost
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import Ownership, PassPlan, ProviderCall
from recovery_ext._store.schema import call_journal, provider_calls
from recovery_ext._store.store import RecoveryStore
import store_rows

ENDPOINT = "http://127.0.0.1:9/v1"


def in_flight(own: Ownership, item: str | None) -> ProviderCall:
    return ProviderCall(endpoint=ENDPOINT, model="m", outcome=IN_FLIGHT, pipeline_id=own.pipeline_id,
                        node_name="a", item_key=item, run_id=own.owner, epoch=own.epoch)


def answered(call: ProviderCall, **figures) -> ProviderCall:
    return ProviderCall(endpoint=call.endpoint, model="m-2", pipeline_id=call.pipeline_id, node_name="a",
                        item_key=call.item_key, run_id=call.run_id, epoch=call.epoch, id=call.id, **figures)


def ledger(store: RecoveryStore, pipeline_id: int) -> dict[str, tuple]:
    pc = provider_calls.c
    with store.read() as conn:
        return {r.id: (r.item_key, r.epoch, r.model, r.tokens_in, r.tokens_out, r.latency_seconds, r.outcome, r.cost,
                       r.reached_checkpoint, r.replays, r.note)
                for r in conn.execute(select(provider_calls).where(pc.pipeline_id == pipeline_id))}


def journal(store: RecoveryStore, pipeline_id: int) -> list[tuple]:
    jc = call_journal.c
    with store.read() as conn:
        return [(r.item_key, r.call_key, r.call_id, r.epoch, r.answer) for r in conn.execute(
            select(call_journal).where(jc.pipeline_id == pipeline_id).order_by(jc.item_key, jc.call_key))]


def test_a_call_is_written_in_flight_completed_with_its_answer_and_replayed(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a")
    first = in_flight(own, "k1")
    assert store.providers.journal_begin(own, first, call_key="fp#1") is None
    assert ledger(store, own.pipeline_id) == {
        first.id: ("k1", own.epoch, "m", 0, 0, 0.0, IN_FLIGHT, None, False, 0, None)}
    done = answered(first, tokens_in=12, tokens_out=7, latency_seconds=0.25, cost=0.5, note="usage read")
    store.providers.journal_answer(own, done, call_key="fp#1", answer='{"a":1}')
    assert journal(store, own.pipeline_id) == [("k1", "fp#1", first.id, own.epoch, '{"a":1}')]
    paid = ("k1", own.epoch, "m-2", 12, 7, 0.25, "ok", 0.5, False, 0, "usage read")
    assert ledger(store, own.pipeline_id) == {first.id: paid}

    # the same call again: the journaled answer and the row that paid for it, one more replay, no new row
    hit = store.providers.journal_begin(own, in_flight(own, "k1"), call_key="fp#1")
    assert hit is not None and hit.answer == '{"a":1}'
    assert (hit.call.id, hit.call.tokens_in, hit.call.outcome, hit.call.cost) == (first.id, 12, "ok", 0.5)
    assert ledger(store, own.pipeline_id) == {first.id: paid[:-2] + (1, "usage read")}

    # no call key (a retry's attempt, an item-less call): a ledger row only; an answer without a key is not kept
    second = in_flight(own, None)
    assert store.providers.journal_begin(own, second, call_key=None) is None
    store.providers.journal_answer(own, answered(second, tokens_in=3), call_key=None, answer=None)
    assert ledger(store, own.pipeline_id)[second.id][:7] == (None, own.epoch, "m-2", 3, 0, 0.0, "ok")
    # a fresh answer replaces the kept one; a row already completed stays as it was
    store.providers.journal_answer(own, answered(first, tokens_in=99), call_key="fp#1", answer='{"a":2}')
    assert journal(store, own.pipeline_id) == [("k1", "fp#1", first.id, own.epoch, '{"a":2}')]
    assert ledger(store, own.pipeline_id)[first.id][3] == 12


def test_a_stale_owner_is_refused_and_writes_nothing(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a")
    kept = in_flight(own, "k1")
    store.providers.journal_begin(own, kept, call_key="fp#1")
    store.providers.journal_answer(own, answered(kept, tokens_in=5), call_key="fp#1", answer='"old"')
    waiting = in_flight(own, "k2")
    store.providers.journal_begin(own, waiting, call_key="fp#1")
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=10, launching=True))
    new = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    rows, entries = ledger(store, own.pipeline_id), journal(store, own.pipeline_id)

    stale = in_flight(own, "k3")
    for write in (
        lambda: store.providers.journal_begin(own, stale, call_key="fp#1"),
        lambda: store.providers.journal_begin(own, stale, call_key=None),
        lambda: store.providers.journal_begin(own, in_flight(own, "k1"), call_key="fp#1"),  # would be a hit
        lambda: store.providers.journal_answer(own, answered(waiting, tokens_in=8), call_key="fp#1", answer='"x"'),
    ):
        with pytest.raises(OwnershipLost, match=r"superseded by run run-2$"):
            write()
    assert ledger(store, own.pipeline_id) == rows  # no row written, no replay counted, nothing completed
    assert journal(store, own.pipeline_id) == entries

    # the new owner's writes go through; a pipeline that is not running refuses its own owner too
    hit = store.providers.journal_begin(new, in_flight(new, "k1"), call_key="fp#1")
    assert hit is not None and hit.answer == '"old"'
    store_rows.fail_pipeline(store, own.pipeline_id, "operator said so")
    with pytest.raises(OwnershipLost, match=r"run-2 \(pipeline failed\)"):
        store.providers.journal_begin(new, in_flight(new, "k4"), call_key=None)
    with pytest.raises(NotFound, match="no pipeline 987654"):
        store.providers.journal_answer(Ownership(987654, 1, "run-1"), answered(waiting), call_key=None, answer=None)


def test_each_journal_write_is_one_round_trip_on_postgresql(pg_url):
    """journal_begin (a miss and a hit) and journal_answer: one Sync each on the wire, no BEGIN/COMMIT (after
    the first use on a connection, which also sends the Parse of the prepared statement)."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
        store.pipelines.start_node(own, "a")
        for item in ("k1", "k2"):  # k1 prepares the statements on the pooled connections
            call = in_flight(own, item)
            writes = [
                partial(store.providers.journal_begin, own, call, call_key="fp#1"),  # a miss
                partial(store.providers.journal_answer, own, answered(call, tokens_in=4), call_key="fp#1", answer="1"),
                partial(store.providers.journal_begin, own, in_flight(own, item), call_key="fp#1"),
            ]  # a hit
            for write in writes:
                with round_trips(store) as messages:
                    write()
                if item == "k2":
                    assert sent_round_trips(messages) == ["Sync"], messages
                    assert messages[-1] == "B ReadyForQuery I", messages  # autocommit: nothing left open
        assert [(r[3], r[6], r[9]) for r in ledger(store, own.pipeline_id).values()] == [(4, "ok", 1)] * 2
    finally:
        store.close()


def test_a_write_whose_commit_landed_before_its_connection_dropped_is_retried_quietly(pg_url, monkeypatch):
    """The server ran the function (autocommit: committed), then the client lost the answer: the store retries,
    and the second attempt finds its own first attempt's rows instead of writing them twice."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
        store.pipelines.start_node(own, "a")
        dropped = drop_answers_once(monkeypatch, "journal_begin", "journal_answer")
        call = in_flight(own, "k1")
        assert store.providers.journal_begin(own, call, call_key="fp#1") is None
        store.providers.journal_answer(own, answered(call, tokens_in=6), call_key="fp#1", answer='"a"')
        assert dropped == ["journal_begin", "journal_answer"]
        assert [(r[3], r[6], r[9]) for r in ledger(store, own.pipeline_id).values()] == [(6, "ok", 0)]
        assert journal(store, own.pipeline_id) == [("k1", "fp#1", call.id, own.epoch, '"a"')]
    finally:
        store.close()
