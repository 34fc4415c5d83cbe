"""The call journal's writes of items in flight together, batched (``journal_writes``, and the group commit
``ctx.map``/``ctx.amap`` put in front of it): the same rows as the single writes, fenced by the epoch, and
after a take-over every write of a batch refused with nothing written. Store tests run on both databases."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select
from helpers import expire, reclaim, round_trips, sent_round_trips
from test_journal_writes import answered, in_flight, journal, ledger

from recovery_ext._dagster.group_commit import GroupCommitter
from recovery_ext._errors import OwnershipLost
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import MAX_TOKENS, JournalWrite, PassPlan
from recovery_ext._store.schema import call_journal
from recovery_ext._store.store import RecoveryStore


def running_node(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a")
    return own


def test_a_batch_writes_what_the_single_writes_write(store):
    own = running_node(store)
    first, second = in_flight(own, "k1"), in_flight(own, "k2")
    assert store.providers.journal_writes(own, [JournalWrite(first, "fp#1"), JournalWrite(second, None)]) == [
        None, None]
    assert {r[0]: r[6] for r in ledger(store, own.pipeline_id).values()} == {"k1": IN_FLIGHT, "k2": IN_FLIGHT}

    # the answers, and in the same batch a new item's begin
    third = in_flight(own, "k3")
    assert store.providers.journal_writes(own, [
        JournalWrite(answered(first, tokens_in=12), "fp#1", answered=True, answer='{"a":1}'),
        JournalWrite(answered(second, tokens_in=3), None, answered=True),
        JournalWrite(third, "fp#1"),
    ]) == [None, None, None]
    assert journal(store, own.pipeline_id) == [("k1", "fp#1", first.id, own.epoch, '{"a":1}')]
    rows = ledger(store, own.pipeline_id)
    assert (rows[first.id][3], rows[first.id][6]) == (12, "ok")
    assert (rows[second.id][3], rows[second.id][6]) == (3, "ok")
    assert rows[third.id][6] == IN_FLIGHT

    # a resume's begin of the same call: the journaled answer and the row that paid for it, one more replay
    again, fresh = in_flight(own, "k1"), in_flight(own, "k4")
    found = store.providers.journal_writes(own, [JournalWrite(fresh, "fp#1"), JournalWrite(again, "fp#1")])
    assert found[0] is None
    assert found[1] is not None and (found[1].answer, found[1].call.id) == ('{"a":1}', first.id)
    rows = ledger(store, own.pipeline_id)
    assert rows[first.id][9] == 1 and again.id not in rows and rows[fresh.id][6] == IN_FLIGHT


def test_after_a_take_over_a_batch_is_refused_whole_and_writes_nothing(store):
    own = running_node(store)
    waiting = in_flight(own, "k1")
    store.providers.journal_writes(own, [JournalWrite(waiting, "fp#1")])
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=10, launching=True))
    store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    rows, entries = ledger(store, own.pipeline_id), journal(store, own.pipeline_id)
    with pytest.raises(OwnershipLost, match=r"superseded by run run-2$"):
        store.providers.journal_writes(own, [
            JournalWrite(answered(waiting, tokens_in=8), "fp#1", answered=True, answer='"x"'),
            JournalWrite(in_flight(own, "k2"), "fp#1"),
            JournalWrite(in_flight(own, "k3"), None),
        ])
    assert ledger(store, own.pipeline_id) == rows  # nothing completed, no row written
    assert journal(store, own.pipeline_id) == entries


def journal_committer(store, own, batches: list[int]) -> GroupCommitter[JournalWrite]:
    def commit(writes):
        batches.append(len(writes))
        return store.providers.journal_writes(own, writes)

    return GroupCommitter(commit, name="rx-journal-a")


def test_64_items_beginning_together_share_a_few_transactions(store):
    own = running_node(store)
    batches: list[int] = []
    committer = journal_committer(store, own, batches)
    start = threading.Barrier(64)

    def begin(i: int) -> object:
        start.wait()
        return committer.submit(JournalWrite(in_flight(own, f"k{i:02d}"), "fp#1")).result(timeout=60)

    try:
        with ThreadPoolExecutor(64) as pool:
            assert list(pool.map(begin, range(64))) == [None] * 64
    finally:
        committer.close()
    assert sum(batches) == 64 and len(batches) < 64
    assert sorted(r[0] for r in ledger(store, own.pipeline_id).values()) == [f"k{i:02d}" for i in range(64)]


def test_after_a_take_over_every_queued_journal_write_is_refused(store):
    own = running_node(store)
    committer = journal_committer(store, own, [])
    before = in_flight(own, "before")
    committer.submit(JournalWrite(before, "fp#1")).result(timeout=30)
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1, launching=True))
    rows = ledger(store, own.pipeline_id)
    futures = [committer.submit(JournalWrite(in_flight(own, f"after{i}"), "fp#1")) for i in range(8)]
    futures.append(committer.submit(JournalWrite(answered(before), "fp#1", answered=True, answer="1")))
    for future in futures:
        with pytest.raises(OwnershipLost):
            future.result(timeout=30)
    committer.close()
    assert ledger(store, own.pipeline_id) == rows  # no request may leave: none was written in flight
    assert journal(store, own.pipeline_id) == []


def test_a_batch_is_one_round_trip_on_postgresql(pg_url):
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = running_node(store)
        for item in ("k1", "k2"):  # k1 prepares the statements on the pooled connection
            calls = [in_flight(own, f"{item}-{i}") for i in range(8)]
            with round_trips(store) as messages:
                store.providers.journal_writes(own, [JournalWrite(call, "fp#1") for call in calls])
            with round_trips(store) as answers:
                store.providers.journal_writes(own, [JournalWrite(answered(call), "fp#1", answered=True, answer="1")
                                                     for call in calls])
        assert sent_round_trips(messages) == ["Sync"], messages
        assert sent_round_trips(answers) == ["Sync"], answers
        assert [r[6] for r in ledger(store, own.pipeline_id).values()] == ["ok"] * 16
    finally:
        store.close()


def test_a_waiter_that_gave_up_does_not_stop_the_writer(store):
    """An asyncio task cancelled while it awaits its write cancels the write's future: the writer settles the
    rest of the batch and goes on (the write itself still commits: a row in flight, outcome unknown)."""
    own = running_node(store)
    gate, entered = threading.Event(), threading.Event()

    def commit(writes):
        entered.set()
        gate.wait(30)
        return store.providers.journal_writes(own, writes)

    committer = GroupCommitter(commit)
    first = committer.submit(JournalWrite(in_flight(own, "k1"), "fp#1"))
    assert entered.wait(30)
    gone = committer.submit(JournalWrite(in_flight(own, "k2"), "fp#1"))
    later = committer.submit(JournalWrite(in_flight(own, "k3"), "fp#1"))
    assert gone.cancel()
    gate.set()
    assert first.result(timeout=30) is None
    assert later.result(timeout=30) is None
    committer.close()
    assert sorted(r[0] for r in ledger(store, own.pipeline_id).values()) == ["k1", "k2", "k3"]


def test_a_batch_keeps_a_new_answer_over_an_old_one_and_finds_many_keys_at_once(store):
    """What a batch keeps and finds (on SQLite fixed SQL on the driver, on PostgreSQL the server's functions):
    a fresh answer replaces the one kept before under the same key, stamped by the database clock; a batch of
    begins finds each journaled answer under its own item and key, and only those."""
    own = running_node(store)
    old, new = in_flight(own, "k1"), in_flight(own, "k1")
    store.providers.journal_writes(own, [JournalWrite(old, None), JournalWrite(new, None)])
    store.providers.journal_writes(own, [JournalWrite(answered(old), "fp#1", answered=True, answer='"old"')])
    store.providers.journal_writes(own, [JournalWrite(answered(new), "fp#1", answered=True, answer='"new"')])
    assert journal(store, own.pipeline_id) == [("k1", "fp#1", new.id, own.epoch, '"new"')]
    with store.read() as conn:
        stamped = conn.execute(select(call_journal.c.answered_at)).scalar_one()
    assert abs((stamped - dt.datetime.now(dt.UTC)).total_seconds()) < 3600

    kept = [in_flight(own, f"item-{i}") for i in range(40)]
    store.providers.journal_writes(own, [JournalWrite(call, f"fp#{i % 3}") for i, call in enumerate(kept)])
    store.providers.journal_writes(own, [JournalWrite(answered(call), f"fp#{i % 3}", answered=True, answer=str(i))
                                         for i, call in enumerate(kept)])
    asked = [(f"item-{i}", f"fp#{i % 3}") for i in range(40)] + [("item-1", "fp#0"), ("item-99", "fp#1")]
    found = store.providers.journal_writes(own, [JournalWrite(in_flight(own, item), key) for item, key in asked])
    assert [None if hit is None else (hit.answer, hit.call.id) for hit in found] == (
        [(str(i), call.id) for i, call in enumerate(kept)] + [None, None])
    assert {kept[i].id: ledger(store, own.pipeline_id)[kept[i].id][9] for i in (0, 39)} == {
        kept[0].id: 1, kept[39].id: 1}


def test_a_batch_keeps_awkward_text_and_figures_exactly(store):
    """Keys, answers and notes with quotes, backslashes, JSON-looking and non-ASCII text, a float that JSON must
    carry to the last bit, the most tokens a call may hold and absent figures: each comes back as it went in."""
    own = running_node(store)
    awkward = ['he said "no"', "C:\\path\\n", '{"not": "json"}', "naïve — 日本語 🙂", "a,b}{[]", "NULL", ""]
    calls = [in_flight(own, key or "empty") for key in awkward]
    begins = [JournalWrite(call, f"fp#{key}") for call, key in zip(calls, awkward, strict=True)]
    assert store.providers.journal_writes(own, begins) == [None] * len(awkward)
    figures = {"tokens_in": MAX_TOKENS - 1, "tokens_out": 0, "latency_seconds": 0.1 + 0.2, "cost": None,
               "note": "note: \"quoted\" \\ 日本"}
    done = [JournalWrite(answered(call, **figures), f"fp#{key}", answered=True, answer=f"answer {key}")
            for call, key in zip(calls, awkward, strict=True)]
    assert store.providers.journal_writes(own, done) == [None] * len(awkward)
    kept = {(item, call_key): answer for item, call_key, _, _, answer in journal(store, own.pipeline_id)}
    assert kept == {(key or "empty", f"fp#{key}"): f"answer {key}" for key in awkward}
    rows = ledger(store, own.pipeline_id)
    for call in calls:
        _, _, model, tokens_in, tokens_out, latency, outcome, cost, _, _, note = rows[call.id]
        assert (model, tokens_in, tokens_out, latency, outcome, cost, note) == (
            "m-2", MAX_TOKENS - 1, 0, 0.1 + 0.2, "ok", None, figures["note"])
    again = [JournalWrite(in_flight(own, key or "empty"), f"fp#{key}") for key in awkward]
    hits = store.providers.journal_writes(own, again)
    assert [(hit.answer, hit.call.id) for hit in hits] == [(f"answer {key}", call.id)
                                                           for key, call in zip(awkward, calls, strict=True)]
