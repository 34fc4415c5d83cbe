"""Item keys and results a checkpoint must keep exactly, or refuse before any work.

- a key neither database could store as text (a lone surrogate, a NUL where PostgreSQL's text refuses it) or
  longer than a PostgreSQL index entry holds is refused by ``ctx.items``, ``ctx.checkpoint`` and the store, before
  its first item or any write, with an error that names it;
- keys and results that JSON text must escape keep their pairs on every batch statement;
- a batch mixing new and degraded keys writes them all.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from helpers import incompressible_key, running_node
from recovery_ext._errors import ConfigurationError
from recovery_ext._store.pipelines import ItemCheckpoint
from recovery_ext._store.schema import node_items
import store_rows


def _items_loop(store, own, keys, batch):
    """The keys ctx.items gave an op body (each completed with its own key), or the error it raised."""
    from dagster import DagsterInstance, build_op_context

    from recovery_ext._dagster.context import NodeContext
    from recovery_ext._liveness.heartbeat import HeartbeatSettings

    started: list[str] = []
    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        try:
            for item in ctx.items(keys, batch=batch):
                started.append(item.key)
                item.complete(item.key)
        except ConfigurationError as exc:
            return exc
    return started


@pytest.mark.parametrize("batch", [1, 50])
def test_an_items_loop_refuses_a_key_with_a_lone_surrogate_before_its_first_item(store, batch):
    """A file name decoded with surrogateescape has no UTF-8 form: neither database could store it as text."""
    own = running_node(store)
    refused = _items_loop(store, own, ["fine", "scan-\udcff.png", "also fine"], batch)
    assert isinstance(refused, ConfigurationError)
    assert "ctx.items: key 'scan-\\udcff.png' holds a lone surrogate" in str(refused)
    assert "no item was started" in str(refused)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {}
    assert store.pipelines.get_node(own.pipeline_id, "a").items_total is None  # refused before the start


def test_an_items_loop_refusal_names_a_surrogate_pair_left_as_two_code_points(store):
    """JSON may spell an emoji as its two UTF-16 halves; a key built from them without json's joining holds two
    surrogate code points, which no database stores either: the refusal says what such a key may be."""
    own = running_node(store)
    refused = _items_loop(store, own, ["fine", "smile-\ud83d\ude00"], 1)
    assert isinstance(refused, ConfigurationError)
    assert "ctx.items: key 'smile-\\ud83d\\ude00' holds a lone surrogate" in str(refused)
    assert "or a surrogate pair left as two code points" in str(refused)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {}


@pytest.mark.parametrize("batch", [1, 50])
def test_a_key_longer_than_an_index_entry_holds_is_refused_where_it_would_fail_the_write(store, batch):
    """PostgreSQL's index entry holds at most 2,704 bytes: a 4,000-byte key that does not compress would fail its
    checkpoint (and the batch with it) after its work was paid for, so it is refused before the first item; a long
    key the server compresses into an entry still checkpoints. SQLite stores both."""
    own = running_node(store)
    long = incompressible_key(4000)
    keys = ["fine", long, "also fine"]
    if store.dialect.key_bytes_max is not None:
        refused = _items_loop(store, own, keys, batch)
        assert isinstance(refused, ConfigurationError)
        assert f"ctx.items: key {long[:80]!r} is 4,000 bytes of UTF-8 that do not compress to the 2,500" in \
            str(refused)
        assert "no item was started" in str(refused) and "short key" in str(refused)
        assert store.pipelines.get_node(own.pipeline_id, "a").items_total is None
        with pytest.raises(ConfigurationError, match="is 4,000 bytes of UTF-8"):  # the store's own check, as a whole
            store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("fine", 1), ItemCheckpoint(long, 2)])
        assert store.pipelines.completed_items(own.pipeline_id, "a") == {}
        # a key the server compresses into an index entry fits, as it did before the check: never refused
        url = "https://example.com/page/" * 200  # 5,000 bytes that compress
        for fits in (incompressible_key(2400), "\u00e9" * 2000, url):
            assert store.dialect.why_unstorable(fits) is None
        assert _items_loop(store, running_node(store), [url], batch) == [url]  # and it checkpoints
        return
    assert _items_loop(store, own, keys, batch) == keys
    assert set(store.pipelines.completed_items(own.pipeline_id, "a")) == set(keys)


def test_a_batch_of_keys_is_judged_as_each_key_alone(store):
    """``first_unstorable`` settles usual keys together, by tests on their joined text: it refuses exactly what
    ``why_unstorable`` refuses key by key, and names the first such key, whatever the batch around it."""
    dialect = store.dialect
    usual = [f"page-{i:04d}" for i in range(1000)]  # joined, far longer than an index entry holds
    assert dialect.first_unstorable(usual) is None
    assert dialect.first_unstorable(["\u00e9t\u00e9", *usual]) is None  # text that is not ASCII, stored as it is
    assert dialect.first_unstorable([]) is None
    for odd in ("scan-\udcff.png", "smile-\ud83d\ude00", "page\x00two", incompressible_key(4000), "\u00e9" * 2000):
        why = dialect.why_unstorable(odd)
        assert dialect.first_unstorable([*usual[:10], odd, *usual[10:]]) == (None if why is None else (odd, why))
    # two refused keys: the first one is named
    assert dialect.first_unstorable(["fine", "a-\udcff", "b-\udcfe"])[0] == "a-\udcff"
    # keys given once, as a generator, are judged as a list of them is (the joined text does not use them up)
    assert dialect.first_unstorable(key for key in ["fine", "a-\udcff"]) == \
        ("a-\udcff", dialect.why_unstorable("a-\udcff"))
    assert dialect.first_unstorable(key for key in usual) is None


@pytest.mark.parametrize("batch", [1, 50])
def test_a_key_with_a_nul_is_refused_where_text_refuses_it_and_resumes_where_text_keeps_it(store, batch):
    own = running_node(store)
    keys = ["fine", "page\x00two", "also fine"]
    if not store.dialect.text_keeps_nul:  # PostgreSQL: refused whole, before the first item
        refused = _items_loop(store, own, keys, batch)
        assert isinstance(refused, ConfigurationError)
        assert "key 'page\\x00two' holds a NUL character, which this database's text cannot store" in str(refused)
        assert store.pipelines.get_node(own.pipeline_id, "a").items_total is None
        return
    # SQLite keeps it: a pipeline that checkpointed such a key before this check existed still resumes
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("page\x00two", "page\x00two"))
    assert _items_loop(store, own, keys, batch) == ["fine", "also fine"]
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {  # a result's NUL is U+FFFD on both
        "fine": "fine", "page\x00two": "page\ufffdtwo", "also fine": "also fine"}


def test_ctx_checkpoint_refuses_a_key_no_checkpoint_could_store_with_a_clear_error(store):
    """``ctx.checkpoint(key)`` gets its key only after the work: what no text of this database stores is refused
    there with the words of ``ctx.items``, not the driver's error (a UnicodeEncodeError, a DataError)."""
    from dagster import DagsterInstance, build_op_context

    from recovery_ext._dagster.context import NodeContext
    from recovery_ext._liveness.heartbeat import HeartbeatSettings

    own = running_node(store)
    nul_refused = not store.dialect.text_keeps_nul
    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        with pytest.raises(ConfigurationError, match=r"ctx.checkpoint: key 'scan-\\udcff.png' holds a lone "
                                                     r"surrogate.*so nothing was written"):
            ctx.checkpoint("scan-\udcff.png", 1)
        if nul_refused:
            with pytest.raises(ConfigurationError, match="holds a NUL character"):
                ctx.checkpoint("page\x00two", 2)
        else:
            ctx.checkpoint("page\x00two", 2)
        ctx.checkpoint("fine", 3)  # the node goes on
    assert store.pipelines.completed_items(own.pipeline_id, "a") == (
        {"fine": 3} if nul_refused else {"page\x00two": 2, "fine": 3})


@pytest.mark.parametrize("batch", [False, True])
def test_the_store_refuses_a_key_its_text_cannot_store_before_any_write(store, batch):
    """A direct caller of the store (no ``ctx.items`` to check keys before the work) gets the store's clear
    refusal, not the driver's UnicodeEncodeError or DataError, and nothing of the call is written: not the
    batch's good item, not its ``also=`` write."""
    own = running_node(store)
    also_ran: list[str] = []
    bad = ["scan-\udcff.png"] + ([] if store.dialect.text_keeps_nul else ["page\x00two"])
    for key in bad:
        entry = ItemCheckpoint(key, 1, also=lambda _tx, key=key: also_ran.append(key))
        with pytest.raises(ConfigurationError, match=r"node 'a': item key .* holds a .*; nothing was written"):
            if batch:
                store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("good", 0), entry])
            else:
                store.pipelines.checkpoint_item(own, "a", entry, stall_timeout=30)
    assert also_ran == [] and store.pipelines.completed_items(own.pipeline_id, "a") == {}
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("good", 0))  # the node goes on
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"good": 0}


def test_a_batch_mixing_new_and_degraded_keys_writes_them_all(store):
    own = running_node(store)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("d1", None, status="degraded"))
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("d2", "fallback", "degraded")])
    store.pipelines.checkpoint_items(
        own,
        "a",
        [ItemCheckpoint("n1", 1), ItemCheckpoint("d1", 11), ItemCheckpoint("n2", 2), ItemCheckpoint("d2", 12)],
        stall_timeout=30,
    )
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"n1": 1, "d1": 11, "n2": 2, "d2": 12}
    assert set(store_rows.item_statuses(store, own.pipeline_id, "a").values()) == {"completed"}
    with store.read() as conn:
        assert set(conn.execute(select(node_items.c.run_id, node_items.c.epoch))) == {(own.owner, own.epoch)}
    assert store.pipelines.get_node(own.pipeline_id, "a").stall_deadline is not None


# Keys and results that JSON text must escape: PostgreSQL's batch statements receive the keys, statuses and
# results as JSON arrays (_checkpoint_items.sql) and zip them back into rows, so each key must keep its own result.
AWKWARD = {'say "hi"': {"q": '"'}, "back\\slash": ["\\", "\\u0000"], "é ü ß": "naïve", "emoji 😀": {"😀": 1},
           "line\u2028sep\nnew": "tab\there", "[1, 2]": [1, 2], "null": None, "": 0, "{": {"nested": {"deep": [{}]}}}


@pytest.mark.parametrize("path", ["new items", "stall push", "degraded redone"])
def test_awkward_keys_and_results_keep_their_pairs_on_every_batch_statement(store, path):
    own = running_node(store)
    keys = list(AWKWARD)
    if path == "degraded redone":  # the first key has a row already: the statement that decides item by item
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(keys[0], "old", status="degraded"))
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint(key, AWKWARD[key]) for key in keys],
                                     stall_timeout=30 if path == "stall push" else None)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == AWKWARD
    assert set(store_rows.item_statuses(store, own.pipeline_id, "a").values()) == {"completed"}
