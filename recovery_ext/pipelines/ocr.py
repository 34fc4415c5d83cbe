"""The OCR job (seed 003): enqueue scanned documents, then drain the queue with heartbeated workers.

Several runs, or one run with N worker threads, may drain the same queue: claims use
``FOR UPDATE SKIP LOCKED`` and every completion is fenced by (worker, attempt), so no
document is processed twice to completion.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dagster import Field, graph, multiprocess_executor

from ..classify import classify
from ..errors import OwnershipLost
from ..heartbeat import HeartbeatSettings, Watchdog
from ..integration import NodeContext, recoverable_op, with_recovery
from ..integration.recoverable import TAG_RESUMED_FROM
from ..redaction import redact
from .ocr_engine import DOCUMENT_SUFFIXES, recognise

DEFAULT_QUEUE = "ocr"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@recoverable_op(config_schema={
    "folder": Field(str, default_value="", description="Folder of PDFs and images; empty: only drain the queue."),
    "queue": Field(str, default_value=DEFAULT_QUEUE, description="Work queue to fill."),
    "max_attempts": Field(int, default_value=3, description="Attempts per document before it is dead."),
})
def enqueue_documents(ctx: NodeContext) -> dict[str, Any]:
    """Put every document of the folder in the queue once (keyed by path and content hash)."""
    cfg = ctx.op_config
    documents: list[Path] = []
    if cfg["folder"]:
        folder = Path(cfg["folder"])
        if not folder.is_dir():
            raise NotADirectoryError(f"OCR input folder does not exist: {folder}")
        documents = sorted(p for p in folder.iterdir() if p.suffix.lower() in DOCUMENT_SUFFIXES)
    payloads = [{"path": str(p.resolve()), "name": p.name, "sha256": _digest(p)} for p in documents]
    added = ctx.store.enqueue(cfg["queue"], payloads, dedupe_keys=[f"{p['path']}#{p['sha256']}" for p in payloads],
                              max_attempts=cfg["max_attempts"])
    ctx.metadata.update({"documents": len(documents), "enqueued": len(added)})
    return {"queue": cfg["queue"], "documents": len(documents), "enqueued": len(added)}


@recoverable_op(config_schema={
    "workers": Field(int, default_value=1, description="Worker threads in this run."),
    "item_heartbeat_interval": Field(float, default_value=10.0, description="Seconds between item heartbeats."),
    "item_heartbeat_timeout": Field(float, default_value=60.0, description="Item is stale after this many seconds."),
})
def ocr_documents(ctx: NodeContext, enqueued: dict[str, Any]) -> dict[str, Any]:
    """Claim documents (SKIP LOCKED), render pages (PDFium), recognise them (RapidOCR), store raw and boosted text."""
    cfg = ctx.op_config
    queue = enqueued["queue"]
    item_settings = HeartbeatSettings(interval=cfg["item_heartbeat_interval"], timeout=cfg["item_heartbeat_timeout"])
    previous = ctx.context.run.tags.get(TAG_RESUMED_FROM)
    if previous:
        # Items the superseded run held can be retried now; its completions are fenced anyway.
        reset = ctx.store.reset_stale(queue=queue, held_by=[previous], reason=f"run {previous} was superseded")
        if reset:
            ctx.log.info(f"reset {len(reset)} documents held by superseded run {previous}")
    counts = {"processed": 0, "failed": 0, "dead": 0}
    lock = threading.Lock()

    def work(slot: int) -> None:
        worker = f"{ctx.context.run_id}:{os.getpid()}:{slot}"
        while True:
            ctx.check()
            claimed = ctx.store.claim(queue, worker, limit=1, heartbeat_timeout=item_settings.timeout)
            if not claimed:
                return
            item = claimed[0]
            beat = Watchdog(lambda: ctx.store.heartbeat_item(item, timeout=item_settings.timeout), item_settings,
                            name=f"ocr-item-{item.id}")
            outcome = "processed"
            with beat:
                try:
                    result = recognise(Path(item.payload["path"]), on_page=lambda n, total: ctx.progress())
                    if beat.lost is not None:
                        raise beat.lost
                    ctx.store.complete_item(item, {"raw_text": result.raw_text, "boosted_text": result.boosted_text,
                                                   "pages": result.pages, "confidence": round(result.confidence, 4)})
                except OwnershipLost as exc:
                    ctx.log.warning(f"document {item.id} was taken over; result discarded: {exc}")
                    outcome = None
                except Exception as exc:  # noqa: BLE001 - each failure goes through the shared classifier
                    found = classify(exc)
                    try:
                        state = ctx.store.fail_item(item, f"{found.category}: {redact(exc)}", retryable=found.retryable)
                    except OwnershipLost:
                        state = None
                    outcome = "dead" if state == "dead" else "failed"
                    ctx.log.warning(f"document {item.payload.get('name')} failed ({found.category}); now {state}")
            ctx.progress()
            if outcome:
                with lock:
                    counts[outcome] += 1

    with ThreadPoolExecutor(max_workers=max(1, cfg["workers"]), thread_name_prefix="ocr") as pool:
        for future in [pool.submit(work, i) for i in range(max(1, cfg["workers"]))]:
            future.result()
    ctx.metadata.update(counts)
    return {"queue": queue, **counts}


@graph(description="OCR scanned PDFs and images through a crash-safe work queue.")
def ocr_graph():
    ocr_documents(enqueue_documents())


def make_ocr_job(folder: str | None = None, *, queue: str = DEFAULT_QUEUE, workers: int = 1,
                 name: str = "ocr_documents", executor_def=multiprocess_executor):
    """The OCR job; ``folder`` becomes the default of its run config."""
    config = {"ops": {"enqueue_documents": {"config": {"folder": folder or "", "queue": queue}},
                      "ocr_documents": {"config": {"workers": workers}}}}
    return ocr_graph.to_job(name=name, executor_def=with_recovery(executor_def), config=config, tags={"recovery/pipeline": "ocr"})
