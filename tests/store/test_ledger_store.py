"""The ledger of provider calls and the shared request/token budgets in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
import time

import pytest

from recovery_pipelines.devserver import wait_for

from recovery_ext._errors import ConfigurationError, IllegalTransition, OwnershipLost
from recovery_ext._store.models import ProviderLimits
from recovery_ext._store.models import ItemCheckpoint, PassPlan, ProviderCall

from helpers import expire, incompressible_key, reclaim
import store_rows


def make(store, owner="run-1"):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner=owner, origin_run_id=owner, params={})
    store.pipelines.start_node(own, "a")
    return own


def call(endpoint="http://127.0.0.1:9/v1", tokens_in=10, tokens_out=5, cost=None, **kw):
    return ProviderCall(endpoint=endpoint, model="m", tokens_in=tokens_in, tokens_out=tokens_out,
                        latency_seconds=0.01, cost=cost, **kw)


def test_a_checkpoint_marks_the_calls_it_keeps_in_its_own_transaction(store):
    own = make(store)
    kept = replace_ctx(call(cost=0.5), own, "a", "k1")
    retried = replace_ctx(call(cost=0.25, outcome="rate_limit", tokens_in=0, tokens_out=0), own, "a", "k1")
    store.providers.record_provider_calls([kept, retried])
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", {"v": 1}, calls=(kept,)))
    late = call(cost=1.0)  # never written before: the checkpoint writes it
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("k2", 2, calls=(late,)), ItemCheckpoint("k3", 3)])
    assert store_rows.reached_checkpoint(store, [kept.id, retried.id, late.id]) == {kept.id: True, retried.id: False,
                                                                        late.id: True}
    rows = {c.id: c for c in store_rows.provider_calls(store, own.pipeline_id)}
    assert (rows[late.id].item_key, rows[late.id].node_name, rows[late.id].run_id, rows[late.id].epoch) == \
        ("k2", "a", "run-1", 1)
    figures = store.reports.provider_costs(own.pipeline_id).pipelines[own.pipeline_id]
    assert (figures.calls, figures.tokens_in, figures.tokens_out, figures.cost) == (3, 20, 10, 1.75)
    assert (figures.wasted_calls, figures.wasted_cost, figures.saved_calls) == (1, 0.25, 0)


def test_a_refused_or_superseded_checkpoint_marks_nothing(store):
    own = make(store)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1))
    first = replace_ctx(call(), own, "a", "k1")
    store.providers.record_provider_calls([first])
    with pytest.raises(IllegalTransition):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1, calls=(first,)))
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1, launching=True))
    late = call()
    with pytest.raises(OwnershipLost):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k2", 2, calls=(late,)))
    assert store_rows.reached_checkpoint(store, [first.id, late.id]) == {first.id: False}


def test_saved_and_wasted_across_a_takeover(store):
    own = make(store)
    kept = [call(tokens_in=100, tokens_out=10, cost=1.0) for _ in range(3)]
    for i, c in enumerate(kept):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(f"k{i}", i, calls=(c,)))
    in_flight = call(tokens_in=100, tokens_out=10, cost=1.0)  # answered, then the worker died
    store.providers.record_provider_calls([replace_ctx(in_flight, own, "a", "k3")])
    report = store.reports.provider_costs(own.pipeline_id).pipelines[own.pipeline_id]
    assert (report.saved_calls, report.wasted_calls) == (0, 0)  # the live owner may still checkpoint it
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1))
    new = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    store.pipelines.start_node(new, "a")
    again = call(tokens_in=100, tokens_out=10, cost=1.0)
    store.pipelines.checkpoint_item(new, "a", ItemCheckpoint("k3", 3, calls=(again,)))
    report = store.reports.provider_costs(own.pipeline_id)
    figures = report.pipelines[own.pipeline_id]
    assert figures.as_dict() == {"calls": 5, "tokens_in": 500, "tokens_out": 50, "cost": 5.0,
                                 "saved_calls": 3, "saved_tokens": 330, "saved_cost": 3.0,
                                 "wasted_calls": 1, "wasted_tokens": 110, "wasted_cost": 1.0,
                                 "replayed_calls": 0, "in_flight_unknown_calls": 0}
    assert report.nodes[own.pipeline_id]["a"] == figures
    assert report.total == figures


def replace_ctx(c, own, node, item):
    from dataclasses import replace

    return replace(c, pipeline_id=own.pipeline_id, node_name=node, item_key=item, run_id=own.owner, epoch=own.epoch)


def test_the_endpoint_is_redacted_and_bad_calls_are_refused_clearly(store):
    own = make(store)
    c = call(endpoint="https://user:hunter22@api.example.com/v1?api_key=sk-abcdefghijklmnop")
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k", 1, calls=(c,)))
    stored = store_rows.provider_calls(store, own.pipeline_id)[0].endpoint
    assert "hunter22" not in stored and "sk-abcdefghijklmnop" not in stored and "api.example.com" in stored
    for bad in ({"tokens_in": -1}, {"tokens_out": 1.5}, {"latency_seconds": float("nan")}, {"cost": -2.0},
                {"outcome": ""}, {"endpoint": " "}):
        with pytest.raises(ConfigurationError):
            ProviderCall(**{"endpoint": "http://x", **bad})


def test_a_call_whose_item_key_the_database_cannot_store_is_recorded_and_its_batch_with_it(store):
    """A key decoded from bytes that are not UTF-8 (a lone surrogate) or, on PostgreSQL, one holding a NUL: the
    paid call is written with U+FFFD in its place, as a call's other texts are, and the calls batched with it
    are written too (the recorder would otherwise keep the whole batch in memory, retrying it for ever)."""
    own = make(store)
    surrogate = replace_ctx(call(cost=0.5), own, "a", "scan-\udcff.png")
    nul = replace_ctx(call(cost=0.25), own, "a", "page\x00two")
    good = replace_ctx(call(cost=1.0), own, "a", "k1")
    store.providers.record_provider_calls([surrogate, nul, good])
    kept_nul = store.dialect.text_keeps_nul
    assert {c.id: c.item_key for c in store_rows.provider_calls(store, own.pipeline_id)} == {
        surrogate.id: "scan-\ufffd.png", nul.id: "page\x00two" if kept_nul else "page\ufffdtwo", good.id: "k1"}
    late = replace_ctx(call(cost=2.0), own, "a", "other-\udcff")  # a checkpoint's batch of calls, too
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1, calls=(good, late)))
    assert store_rows.reached_checkpoint(store, [good.id, late.id]) == {good.id: True, late.id: True}


def test_a_call_whose_item_key_is_longer_than_an_index_entry_holds_is_recorded_cut_to_fit(store):
    """``record_call(item=...)`` takes any text: a key longer than PostgreSQL's index entry holds is kept cut to
    fit, ending in a hash of the whole key (two long keys stay two), and the calls batched with it are written; a
    checkpoint that keeps such a call is written too. SQLite keeps the key whole."""
    own = make(store)
    first = replace_ctx(call(cost=0.5), own, "a", incompressible_key(4000) + "-one")
    second = replace_ctx(call(cost=0.5), own, "a", incompressible_key(4000) + "-two")  # the same 4,000 first
    good = replace_ctx(call(cost=1.0), own, "a", "k1")
    store.providers.record_provider_calls([first, second, good])
    kept = {c.id: c.item_key for c in store_rows.provider_calls(store, own.pipeline_id)}
    limit = store.dialect.key_bytes_max
    if limit is None:
        assert kept == {first.id: first.item_key, second.id: second.item_key, good.id: "k1"}
    else:
        assert kept[good.id] == "k1" and kept[first.id] != kept[second.id]
        for c in (first, second):
            assert len(kept[c.id]) == limit and "...sha256:" in kept[c.id]
            assert c.item_key.startswith(kept[c.id].split("...sha256:")[0])
    late = replace_ctx(call(cost=2.0), own, "a", incompressible_key(4000, seed=8))  # kept by a checkpoint
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1, calls=(good, late)))
    assert store_rows.reached_checkpoint(store, [good.id, late.id]) == {good.id: True, late.id: True}


def test_a_model_name_longer_than_any_providers_is_kept_cut_and_its_call_written(store):
    """A batch result's "model" or Azure's modelId is the provider's own word: a 4,000-character one (no real
    provider's) is kept as its first 200 characters, so the ledger's totals, keyed by model, take the call."""
    own = make(store)
    model = incompressible_key(4000)
    paid = replace_ctx(ProviderCall(endpoint="http://127.0.0.1:9/v1", model=model, tokens_in=10, cost=0.5), own,
                       "a", "k1")
    assert paid.model == model[:200]
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1, calls=(paid,)))
    assert [c.model for c in store_rows.provider_calls(store, own.pipeline_id)] == [model[:200]]
    assert store.reports.provider_costs(own.pipeline_id).pipelines[own.pipeline_id].cost == 0.5


def test_budget_grants_until_the_window_is_full_then_says_how_long_to_wait(store):
    limits = ProviderLimits(requests_per_minute=3, tokens_per_minute=100, window_seconds=1.0, margin_seconds=0.0)
    grants = [store.providers.budget_reserve("http://e/v1", None, tokens=30, limits=limits) for _ in range(3)]
    for g in grants:
        store.providers.budget_answered(g.reservation)
    grants.append(store.providers.budget_reserve("http://e/v1", None, tokens=30, limits=limits))
    assert [g.granted for g in grants] == [True, True, True, False]
    assert 0 < grants[3].wait_seconds <= 1.0
    store.providers.budget_settle(grants[0].reservation, 5)  # the usage was smaller than the estimate
    assert not store.providers.budget_reserve("http://e/v1", None, tokens=30, limits=limits).granted  # 3 requests still
    time.sleep(grants[3].wait_seconds + 0.05)
    assert store.providers.budget_reserve("http://e/v1", None, tokens=30, limits=limits).granted
    with pytest.raises(ConfigurationError):
        store.providers.budget_reserve("http://e/v1", None, tokens=101, limits=limits)
    with pytest.raises(ConfigurationError):
        ProviderLimits(requests_per_minute=0)
    # A model's own budget is apart from the endpoint's.
    per_model = ProviderLimits(requests_per_minute=3, tokens_per_minute=100, window_seconds=1.0, margin_seconds=0.0,
                               per_model=True)
    assert store.providers.budget_reserve("http://e/v1", "big", tokens=90, limits=per_model).granted
    assert sorted((b["endpoint"], b["model"]) for b in store_rows.budgets(store)) == [
        ("http://e/v1", ""),
        ("http://e/v1", "big"),
    ]


def test_a_request_in_flight_holds_its_room_until_one_window_after_its_answer(store):
    # a 1.5 s window: the refusal right after the answer must come inside it, also on a busy machine
    limits = ProviderLimits(requests_per_minute=1, window_seconds=1.5, margin_seconds=0.0)
    first = store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits)
    assert first.granted
    time.sleep(1.8)  # longer than the window: the request is still on its way to the provider
    waiting = store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits)
    # asked again soon (a twentieth of the window): it may be answered any moment
    assert not waiting.granted and waiting.wait_seconds <= limits.window_seconds / 20
    store.providers.budget_answered(first.reservation)  # the provider counted it somewhere before now
    assert not store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits).granted
    later = wait_for(
        lambda: store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits).granted,
        timeout=5,
        interval=0.05,
        what="the room one window after the answer",
    )
    assert later


def test_a_dead_holders_reservation_counts_until_its_pipeline_is_reclaimed_then_one_window_more(store):
    """Issue 40, 5: a holder killed mid-call held its room for five windows whatever the recovery pass knew, and
    stopped counting after them even while its holder was alive. Now it counts until the reclaim supersedes its
    holder, and then as if answered at the reclaim: the provider counted it before the kill, so at most one
    window after the reclaim."""
    from sqlalchemy import select, update

    from recovery_ext._store.schema import rate_reservations

    rr = rate_reservations.c
    limits = ProviderLimits(requests_per_minute=1, window_seconds=60.0, margin_seconds=1.0)
    own = make(store)
    held = store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits, holder="run-1/1/a", own=own)
    assert held.granted

    def moved_back(column, seconds: float) -> None:
        with store.write() as conn:
            conn.execute(update(rate_reservations).where(rr.id == held.reservation)
                         .values({column: store.dialect.now_plus(-seconds)}))

    moved_back("reserved_at", 10 * 61.0)  # in flight for ten windows: its holder may still be waiting for it
    asking = store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits)
    assert not asking.granted and asking.wait_seconds <= 3.05  # held, and asked again soon
    expire(store, own.pipeline_id)
    [reclaimed], _ = reclaim(store, PassPlan(limit=1))  # a real reclaim: the holder's epoch is superseded
    assert reclaimed.pipeline_id == own.pipeline_id
    with store.read() as conn:
        assert conn.scalar(select(rr.answered_at).where(rr.id == held.reservation)) is not None
    after = store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits)
    assert not after.granted and 55.0 < after.wait_seconds <= 61.0  # one window from the reclaim, no longer
    moved_back("answered_at", 61.5)
    assert store.providers.budget_reserve("http://e/v1", None, tokens=1, limits=limits).granted


def test_a_budget_is_the_whole_endpoints_unless_its_limits_are_per_model(store):
    limits = ProviderLimits(requests_per_minute=1, window_seconds=30.0)
    assert store.providers.budget_reserve("http://e/v1", "small", tokens=1, limits=limits).granted
    assert not store.providers.budget_reserve("http://e/v1", "big", tokens=1, limits=limits).granted  # the same budget
    assert [b["model"] for b in store_rows.budgets(store)] == [""]


def test_tokens_free_up_when_usage_corrects_the_reservation(store):
    limits = ProviderLimits(tokens_per_minute=100, per_model=True, window_seconds=30.0, margin_seconds=0.0)
    first = store.providers.budget_reserve("http://e/v1", "m", tokens=80, limits=limits)
    assert first.granted and not store.providers.budget_reserve("http://e/v1", "m", tokens=80, limits=limits).granted
    store.providers.budget_settle(first.reservation, 10)
    assert store.providers.budget_reserve("http://e/v1", "m", tokens=80, limits=limits).granted


def test_concurrent_reservers_never_share_the_last_request(db_url):
    from recovery_ext._store.store import RecoveryStore

    stores = [RecoveryStore(db_url) for _ in range(4)]
    stores[0].migrate()
    granted: list[int] = []
    barrier = threading.Barrier(4)

    def ask(s):
        barrier.wait()
        for _ in range(10):
            g = s.providers.budget_reserve("http://e/v1", None, tokens=1,
                                 limits=ProviderLimits(requests_per_minute=7, window_seconds=60.0, margin_seconds=0.0))
            if g.granted:
                granted.append(g.reservation)

    threads = [threading.Thread(target=ask, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert len(granted) == 7 and len(set(granted)) == 7


def test_calls_recorded_while_the_database_is_away_wait_in_memory_and_go_with_the_next_checkpoint():
    from pg_cluster import PrivateCluster

    from recovery_ext._providers.ledger import CallRecorder
    from recovery_ext._store.store import RecoveryStore
    from recovery_pipelines.devserver import wait_for

    cluster = PrivateCluster().init()
    cluster.start()
    try:
        store = RecoveryStore(cluster.create_database("ledger"), retry_budget=1.0, connect_timeout=2)
        store.migrate()
        own = make(store)
        recorder = CallRecorder(store, linger=0.1)
        cluster.stop()
        answered = replace_ctx(call(cost=0.5), own, "a", "k1")
        refused = replace_ctx(call(outcome="rate_limit", tokens_in=0, tokens_out=0), own, "a", "k2")
        recorder.record(answered)  # never raises, whatever the database does
        recorder.record(refused)
        assert recorder.flush() is False and recorder.pending == 2  # kept in memory
        cluster.start()
        cluster.wait_ready()
        # the next checkpoint writes its call
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1, calls=(answered,)))
        recorder.written([answered])
        wait_for(lambda: recorder.pending == 0, timeout=30, what="the writer to write the other call")
        assert store_rows.reached_checkpoint(store, [answered.id, refused.id]) == {answered.id: True, refused.id: False}
        assert recorder.failures >= 1
        store.close()
    finally:
        cluster.destroy()


def test_a_recorded_endpoint_never_keeps_a_credential():
    """Any client may record calls: the ledger masks userinfo and password-like parameters itself."""
    from recovery_ext import ProviderCall

    call = ProviderCall(endpoint="https://user:s3cret@llm.example/v1?api_key=k3y&region=eu", model="m")
    assert "s3cret" not in call.endpoint and "k3y" not in call.endpoint
    assert call.endpoint.startswith("https://") and "llm.example/v1" in call.endpoint and "region=eu" in call.endpoint
