"""The report of a queue pipeline (OCR): documents count as its runs' items, and a crash is drawn at the
run's last sign of life, its last heartbeat, not only at its last write."""

from __future__ import annotations

import time

from helpers import expire

from recovery_ext import scan
from recovery_ext._observe.timeline import build_timeline
from recovery_ext._store.models import PipelineBeat


def test_a_queue_pipelines_report_counts_each_runs_documents_and_places_the_crash_at_its_last_heartbeat(store):
    own = store.pipelines.create_pipeline("ocr_documents", ["ocr"], owner="run-1", origin_run_id="run-1")
    store.queue.enqueue("ocr", [{"doc": n} for n in range(5)], own=own)
    store.pipelines.start_node(own, "ocr")
    for item in store.queue.claim("ocr", "run-1:1:0", limit=3, heartbeat_timeout=60, own=own):
        store.queue.complete_item(item, {"text": "..."})
    store.queue.claim("ocr", "run-1:1:0", limit=1, heartbeat_timeout=60, own=own)  # in hand when the run dies
    time.sleep(0.05)  # the run worker's heartbeat comes after its last write, as while a document is recognised
    store.pipelines.pulse([PipelineBeat(own, 60)])
    expire(store, own.pipeline_id, ago=5.0)  # its heartbeat deadline passed 5 s ago, on the database clock
    stats = scan(store)
    assert [r.pipeline_id for r in stats.reclaimed_pipelines] == [own.pipeline_id]
    resumed = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    store.pipelines.start_node(resumed, "ocr")
    while claimed := store.queue.claim("ocr", "run-2:1:0", limit=5, heartbeat_timeout=60, own=resumed):
        for item in claimed:
            store.queue.complete_item(item, {"text": "..."})
    store.pipelines.complete_node(resumed, "ocr")

    timeline = build_timeline(store.reports.pipeline_history(own.pipeline_id))
    first, second = timeline.runs
    assert (first.outcome, first.items, second.items) == ("crashed", {"completed": 3}, {"completed": 2})
    assert first.items_by_node == {"queue ocr": 3} and len(timeline.item_times) == 5
    # the reclaim measured how long its heartbeat had been silent: that is when the run was last alive
    (fault,) = [m for m in timeline.markers if m.kind == "fault"]
    (reclaim,) = [m for m in timeline.markers if m.kind == "reclaim"]
    reclaimed = next(
        t for t in store.reports.pipeline_history(own.pipeline_id).transitions if t["event"] == "reclaimed"
    )
    silent = reclaimed["data"]["heartbeat_age_seconds"]
    assert silent > 0 and abs((reclaim.at - fault.at).total_seconds() - silent) < 0.01
    assert fault.label == "run 1: its last heartbeat" and first.ended_at == fault.at
