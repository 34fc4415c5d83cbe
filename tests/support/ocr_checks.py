"""What the OCR recovery tests check of a finished queue pipeline: every document completed once, before it."""

from __future__ import annotations


def completions(store):
    """Queue item id -> number of times it was completed, from the recorded transitions."""
    counts: dict[int, int] = {}
    for t in store.reports.transitions_for(entity_type="queue_item"):
        if t["to_status"] == "completed":
            counts[t["entity_id"]] = counts.get(t["entity_id"], 0) + 1
    return counts


def assert_every_document_completed_once_before_the_pipeline(store, pipeline_id, docs):
    items = store.queue.list_items("ocr")
    assert len(items) == len(docs)
    assert {i.status for i in items} == {"completed"}, [(i.id, i.status, i.worker) for i in items]
    assert completions(store) == {i.id: 1 for i in items}
    pipeline = store.pipelines.get_pipeline(pipeline_id)
    assert pipeline.status == "completed"
    assert pipeline.completed_at >= max(i.completed_at for i in items)
    history = store.reports.transitions_for(pipeline_id=pipeline_id)
    node_done = [t["id"] for t in history if t["entity_type"] == "node" and t["to_status"] == "completed"]
    last_item = max(
        t["id"] for t in store.reports.transitions_for(entity_type="queue_item") if t["to_status"] == "completed"
    )
    assert max(node_done) > last_item  # the OCR node completed only after the last document
