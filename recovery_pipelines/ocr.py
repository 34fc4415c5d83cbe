"""The OCR job: enqueue scanned documents, then drain the queue with heartbeated workers.

Several runs, or one run with N worker threads, may drain the same queue: claims use
``FOR UPDATE SKIP LOCKED`` and every claim, item heartbeat and completion is fenced by the
pipeline's epoch and by (worker, attempt), so no document is completed twice and a
superseded run can neither claim nor complete one. Nothing is lost: the OCR node completes
only when every document of its pipeline is finished.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pydantic
from dagster import Config, Failure, Field, graph, multiprocess_executor

from recovery_ext import (HeartbeatSettings, ItemTakenOver, NodeContext, OwnershipLost, StopRequested, Watchdog,
                          classify, recoverable_op, redact, with_recovery)
from recovery_ext.store import LEGACY_STALE_SECONDS, validate_backoff
from recovery_pipelines.ocr_engine import DOCUMENT_SUFFIXES, recognise

DEFAULT_QUEUE = "ocr"
LOCAL, TEXTRACT = "local", "textract"
PROVIDERS = (LOCAL, TEXTRACT)


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
    """Put every document of the folder in the queue once (keyed by path and content hash).

    The output lists the ids of all the folder's documents, new or already queued: the OCR
    node completes only once each of them is finished.
    """
    cfg = ctx.op_config
    documents: list[Path] = []
    if cfg["folder"]:
        folder = Path(cfg["folder"])
        if not folder.is_dir():
            raise NotADirectoryError(f"OCR input folder does not exist: {folder}")
        documents = sorted(p for p in folder.iterdir() if p.suffix.lower() in DOCUMENT_SUFFIXES)
    payloads = [{"path": str(p.resolve()), "name": p.name, "sha256": _digest(p)} for p in documents]
    keys = [f"{p['path']}#{p['sha256']}" for p in payloads]
    queue = ctx.queue(cfg["queue"])
    added = queue.enqueue(payloads, dedupe_keys=keys, max_attempts=cfg["max_attempts"])
    item_ids = queue.item_ids(keys)
    ctx.metadata.update({"documents": len(documents), "enqueued": len(added)})
    return {"queue": cfg["queue"], "documents": len(documents), "enqueued": len(added), "item_ids": item_ids}


class OcrDocumentsConfig(Config):
    """The OCR node's settings; ``provider`` picks who recognises the documents."""

    workers: int = pydantic.Field(default=1, description="Worker threads in this run (local provider).")
    item_heartbeat_interval: float = pydantic.Field(default=10.0, description="Seconds between item heartbeats.")
    item_heartbeat_timeout: float = pydantic.Field(
        default=60.0, description="A processing document whose heartbeat is this old is stale.")
    legacy_stale_seconds: float = pydantic.Field(
        default=LEGACY_STALE_SECONDS,
        description="Stale threshold for rows without a heartbeat deadline (legacy rows).")
    retry_initial_delay: float = pydantic.Field(
        default=30.0, description="Seconds a failed document waits before its first retry; doubles.")
    retry_max_delay: float = pydantic.Field(default=1800.0, description="Upper bound of the retry delay.")
    retry_jitter: float = pydantic.Field(default=0.1, description="Relative jitter of the retry delay (0 to 1).")
    wait_poll_interval: float = pydantic.Field(
        default=5.0, description="While its documents wait for a retry or another worker: check this often.")
    provider: str = pydantic.Field(
        default=LOCAL, description="'local': RapidOCR in this process; 'textract': Amazon Textract's asynchronous "
                                   "text detection as a provider job (the aws extra), re-attached after a crash.")
    textract_region: str = pydantic.Field(default="us-east-1", description="Textract's AWS region.")
    textract_endpoint_url: str = pydantic.Field(
        default="", description="Textract's endpoint; empty: AWS's own for the region (a stand-in's URL in tests).")
    textract_bucket: str = pydantic.Field(default="", description="The S3 bucket Textract reads the documents from.")
    textract_prefix: str = pydantic.Field(default="", description="Each document's S3 key: this prefix + its name.")
    textract_price_per_page: float | None = pydantic.Field(
        default=None, description="What Textract charges per page, for the ledger's cost; empty: not priced.")
    provider_poll_seconds: float = pydantic.Field(default=5.0, description="How often the provider job is polled.")
    provider_max_attempts: int = pydantic.Field(
        default=3, description="Provider jobs per document (a failed one is resubmitted) before it fails for good.")


@recoverable_op
def ocr_documents(ctx: NodeContext, enqueued: dict[str, Any], config: OcrDocumentsConfig) -> dict[str, Any]:
    """Claim documents (SKIP LOCKED), render pages (PDFium), recognise them (RapidOCR), store raw and boosted text;
    with ``provider: textract`` the claimed documents go to Textract as one asynchronous provider job.

    Completes only when every document of this pipeline is finished (completed, dead or
    failed): documents waiting for a retry, or held by another worker, are waited for, and
    taken over once their holder's heartbeat expires.
    """
    if config.provider not in PROVIDERS:
        raise Failure(description=f"ocr_documents: provider must be one of {', '.join(PROVIDERS)}, got "
                                  f"{config.provider!r}", allow_retries=False)
    queue = enqueued["queue"]
    own_ids = list(enqueued.get("item_ids") or [])
    item_settings = HeartbeatSettings(interval=config.item_heartbeat_interval, timeout=config.item_heartbeat_timeout)
    backoff = validate_backoff(config.retry_initial_delay, config.retry_max_delay, config.retry_jitter)
    handle = ctx.queue(queue)
    released = handle.release_superseded()
    handle.count_finished(own_ids)  # documents an earlier run finished: kept, not redone
    if released:
        ctx.log.info(f"released {len(released)} documents held by superseded runs of pipeline {ctx.pipeline_id}: "
                     f"{sorted(r.id for r in released)}")
    drain = QueueDrain(ctx, queue, own_ids, item_settings, backoff, config)
    if config.provider == TEXTRACT:
        from recovery_pipelines.ocr_async import TextractDrain

        TextractDrain(ctx, queue, own_ids, item_settings, config, drain.wait_for_documents).run()
    else:
        drain.run()
    # Done, failed, dead and released documents are the node's item counts (ctx.items_*), reported as
    # output metadata in the same words as every other node's items.
    ctx.metadata.update({"documents": len(own_ids),
                         **{f"items_{k}": n for k, n in drain.counts.items() if n}})
    return {"queue": queue, "items_done": ctx.items_done, "items_failed": ctx.items_failed,
            "items_dead": ctx.items_dead}


class QueueDrain:
    """The worker threads of one OCR node: claim, recognise with an item heartbeat, complete or fail."""

    def __init__(self, ctx: NodeContext, queue: str, own_ids: list[int], item_settings: HeartbeatSettings,
                 backoff, cfg: OcrDocumentsConfig) -> None:
        self.ctx = ctx
        self.queue = ctx.queue(queue)
        self.own_ids = own_ids
        self.item_settings = item_settings
        self.backoff = backoff
        self.cfg = cfg
        self.counts = {"taken_over": 0, "completed_late": 0}  # beside the node's own item counts
        self.lock = threading.Lock()
        self.idle = threading.Event()  # never set: its wait() is an interruptible sleep

    def run(self) -> None:
        workers = max(1, self.cfg.workers)
        while True:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ocr") as pool:
                for future in [pool.submit(self.work, slot) for slot in range(workers)]:
                    future.result()
            # A worker stops only when none of the pipeline's documents is left; checked once more
            # after all of them stopped, so the node never completes with one unfinished.
            if not self.queue.unfinished(self.own_ids):
                return

    def count(self, outcome: str) -> None:
        with self.lock:
            self.counts[outcome] += 1

    def work(self, slot: int) -> None:
        ctx = self.ctx
        worker = f"{ctx.context.run_id}:{os.getpid()}:{slot}"
        while True:
            ctx.check()
            claimed = self.queue.claim(worker, limit=1, heartbeat_timeout=self.item_settings.timeout,
                                       legacy_stale_seconds=self.cfg.legacy_stale_seconds)
            if claimed:
                self.process(claimed[0])
                ctx.progress()
                continue
            if not self.wait_for_documents():
                return

    def wait_for_documents(self) -> bool:
        """Nothing claimable now. False when all of the pipeline's documents are finished; else
        wait for the next retry or heartbeat deadline (at most the poll interval) and say True."""
        unfinished = self.queue.unfinished(self.own_ids)
        if not unfinished:
            return False
        until = self.queue.seconds_until_claimable()
        pause = self.cfg.wait_poll_interval if until is None else min(self.cfg.wait_poll_interval, until + 0.05)
        # Waiting for a scheduled retry or a live holder is not a stall: report progress.
        self.ctx.progress()
        watchdog = self.ctx.watchdog
        (watchdog.superseded if watchdog is not None else self.idle).wait(max(0.05, pause))
        return True

    def process(self, item) -> None:
        ctx = self.ctx
        name = item.payload.get("name") if isinstance(item.payload, dict) else None
        beat = Watchdog(lambda: self.queue.heartbeat(item, timeout=self.item_settings.timeout),
                        self.item_settings, name=f"ocr-item-{item.id}")
        with beat:
            try:
                result = recognise(Path(item.payload["path"]), on_page=lambda n, total: ctx.progress())
            except (OwnershipLost, StopRequested):
                raise  # this run was superseded: the new owner releases and redoes the document
            except Exception as exc:  # noqa: BLE001 - each failure goes through the shared classifier
                self.fail(item, name, exc)
                return
        # The item heartbeat may have been refused meanwhile; the store still takes the result
        # unless another worker holds the document or this pipeline was superseded.
        try:
            came_from = self.queue.complete(item, {"raw_text": result.raw_text,
                                                   "boosted_text": result.boosted_text,
                                                   "pages": result.pages,
                                                   "confidence": round(result.confidence, 4)})
        except ItemTakenOver as exc:
            ctx.log.warning(f"document {name} ({item.id}) was taken over; result discarded: {exc}")
            self.count("taken_over")
            return
        ctx.log.info(f"document {name} ({item.id}) recognised: {result.pages} page(s), "
                     f"confidence {result.confidence:.2f}")
        if came_from != "processing":
            self.count("completed_late")
            ctx.log.info(f"document {name} ({item.id}) was reset as stale while still being recognised; "
                         "nobody took it over, its result is kept")

    def fail(self, item, name: str | None, exc: Exception) -> None:
        found = classify(exc)
        try:
            state = self.queue.fail(item, f"{found.category}: {redact(exc)}", retryable=found.retryable,
                                    backoff=self.backoff)
        except ItemTakenOver as lost:
            self.ctx.log.warning(f"document {name} ({item.id}) failed ({found.category}) but was taken over: {lost}")
            self.count("taken_over")
            return
        self.ctx.log.warning(f"document {name} ({item.id}) failed ({found.category}); now {state}")


@graph(description="OCR scanned PDFs and images through a crash-safe work queue.")
def ocr_graph():
    ocr_documents(enqueue_documents())


def make_ocr_job(folder: str | None = None, *, queue: str = DEFAULT_QUEUE, workers: int = 1,
                 name: str = "ocr_documents", executor_def=multiprocess_executor,
                 ocr_config: dict[str, Any] | None = None):
    """The OCR job; ``folder`` and ``ocr_config`` (ocr_documents' settings) become its default run config."""
    config = {"ops": {"enqueue_documents": {"config": {"folder": folder or "", "queue": queue}},
                      "ocr_documents": {"config": {"workers": workers, **(ocr_config or {})}}}}
    return ocr_graph.to_job(name=name, executor_def=with_recovery(executor_def), config=config,
                            tags={"recovery/pipeline": "ocr"})
