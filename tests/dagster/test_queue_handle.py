"""The op-facing queue handle (issue 9 item 2, fenced by construction): ``ctx.queue(name)``.

Every write made through it is fenced by the node's pipeline epoch; items it did not claim for
that epoch are refused; shipped op code reaches the queue only through it (never the raw store).
Runs on SQLite and on a real PostgreSQL database.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import recovery_pipelines
from helpers import expire, reclaim
from recovery_ext._errors import ItemTakenOver, OwnershipLost
from recovery_ext._dagster.context import NodeContext
from recovery_ext._dagster.queue_handle import QueueHandle
from recovery_ext._store.models import PassPlan

PIPELINES = Path(recovery_pipelines.__file__).parent


def node_context(store, own) -> NodeContext:
    return NodeContext(None, store, own, "ocr_documents", settings=None, watchdog=None, resource=None)


# The modules whose code runs inside ops and assets; the demo's operator tools (cli.py, demo_crash.py,
# devserver.py) open the store on purpose, as `recovery-ext` does.
OP_MODULES = ["ontology.py", "ocr.py", "ocr_assets.py", "llm.py", "ocr_engine.py", "assembly.py", "sample_data.py"]


def test_shipped_op_code_never_reaches_the_raw_store():
    offenders = []
    for source in [PIPELINES / name for name in OP_MODULES]:
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if re.search(r"\._store\b|\bctx\.store\b|\bget_store\(|\bRecoveryStore\b", line):
                offenders.append(f"{source.name}:{number}: {line.strip()}")
    assert offenders == []
    assert "ctx.queue(" in (PIPELINES / "ocr.py").read_text()  # the OCR job drains its queue through the handle


def test_the_handle_claims_and_finishes_items_for_its_epoch(store):
    own = store.pipelines.create_pipeline("ocr_documents", ["ocr_documents"], owner="run-1")
    queue = node_context(store, own).queue("ocr")
    assert isinstance(queue, QueueHandle) and not hasattr(queue, "store")
    ids = queue.enqueue([{"doc": d} for d in "abc"], dedupe_keys=list("abc"))
    assert queue.enqueue([{"doc": "a"}], dedupe_keys=["a"]) == []  # deduped
    assert queue.item_ids(list("cab")) == [ids[2], ids[0], ids[1]]
    a, b = queue.claim("run-1:0", limit=2, heartbeat_timeout=60)
    assert (a.holder_pipeline_id, a.holder_epoch) == (own.pipeline_id, own.epoch)
    queue.heartbeat(a, timeout=60)
    assert queue.complete(a, {"raw": "text"}) == "processing"
    assert queue.fail(b, "permanent: bad page", retryable=False) == "failed"
    assert [i.id for i in queue.unfinished(ids)] == [ids[2]]
    assert {i.id: i.status for i in store.queue.list_items("ocr")} == {ids[0]: "completed", ids[1]: "failed",
                                                                 ids[2]: "ready"}


def test_after_a_reclaim_every_write_through_the_old_handle_is_refused_and_changes_nothing(store):
    own = store.pipelines.create_pipeline("ocr_documents", ["ocr_documents"], owner="run-1")
    old = node_context(store, own).queue("ocr")
    old.enqueue([{"doc": d} for d in "ab"], dedupe_keys=["a", "b"])
    a, b = old.claim("run-1:0", limit=2, heartbeat_timeout=600)
    expire(store, own.pipeline_id)
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    new_own = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=reclaimed.resume_number)
    before = {(i.id, i.status, i.worker, i.attempts) for i in store.queue.list_items("ocr")}
    for write in (lambda: old.claim("run-1:0"), lambda: old.heartbeat(a, timeout=60),
                  lambda: old.complete(a, {"raw": "zombie"}), lambda: old.fail(b, "boom"),
                  lambda: old.enqueue([{"doc": "z"}], dedupe_keys=["z"]), old.release_superseded):
        with pytest.raises(OwnershipLost) as refused:
            write()
        assert type(refused.value) is OwnershipLost  # refused by the pipeline's epoch fence
    assert {(i.id, i.status, i.worker, i.attempts) for i in store.queue.list_items("ocr")} == before
    new = node_context(store, new_own).queue("ocr")
    assert sorted(r.id for r in new.release_superseded()) == sorted([a.id, b.id])
    for item in new.claim("run-2:0", limit=2, heartbeat_timeout=60):
        new.complete(item, {"raw": "ok"})
    assert {i.status for i in store.queue.list_items("ocr")} == {"completed"}


def test_an_item_not_claimed_for_this_epoch_or_queue_is_refused_before_any_write(store):
    own = store.pipelines.create_pipeline("ocr_documents", ["ocr_documents"], owner="run-1")
    ctx = node_context(store, own)
    ctx.queue("ocr").enqueue([{"doc": "a"}], dedupe_keys=["a"])
    unfenced = store.queue.claim("ocr", "someone-else")[0]  # a claim with no pipeline: no epoch to fence by
    other_queue = ctx.queue("other")
    for write in (lambda: ctx.queue("ocr").complete(unfenced, {"raw": "x"}),
                  lambda: ctx.queue("ocr").heartbeat(unfenced, timeout=60),
                  lambda: ctx.queue("ocr").fail(unfenced, "boom")):
        with pytest.raises(ItemTakenOver, match="not held for pipeline"):
            write()
    other_queue.enqueue([{"doc": "b"}], dedupe_keys=["b"])
    mine = other_queue.claim("run-1:0")[0]
    with pytest.raises(ItemTakenOver, match="in queue 'ocr'"):
        ctx.queue("ocr").complete(mine, {"raw": "x"})
    assert (
        store.queue.get_item(unfenced.id).status == "processing"
        and store.queue.get_item(mine.id).status == "processing"
    )


def test_a_step_whose_run_worker_is_gone_claims_no_new_item_but_keeps_the_one_it_holds(store):
    import threading

    from recovery_ext._errors import StopRequested

    own = store.pipelines.create_pipeline("ocr_documents", ["ocr_documents"], owner="run-1")
    gone = threading.Event()
    ctx = NodeContext(None, store, own, "ocr_documents", settings=None, watchdog=None, resource=None,
                      run_worker_gone=gone)
    queue = ctx.queue("ocr")
    ids = queue.enqueue([{"doc": d} for d in "ab"], dedupe_keys=list("ab"))
    (held,) = queue.claim("run-1:0", limit=1, heartbeat_timeout=60)
    gone.set()  # the run worker died: the step's parent watch says so
    with pytest.raises(StopRequested, match="run worker is gone"):
        queue.claim("run-1:0", limit=1, heartbeat_timeout=60)
    assert queue.complete(held, {"raw": "text"}) == "processing"  # what it holds is still kept
    assert {i.id: i.status for i in store.queue.list_items("ocr")} == {held.id: "completed",
                                                                 next(i for i in ids if i != held.id): "ready"}
