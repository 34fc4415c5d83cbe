"""The OCR node's async-provider mode (``provider: textract``): the documents it claims go to Amazon Textract's
asynchronous text detection as one provider job (:class:`recovery_ext.TextractJobs`, run by
:func:`recovery_ext.run_provider_job`) instead of the local engine.

While the job runs the pipeline shows ``waiting``, its heartbeat goes on and so do the claimed documents'
item heartbeats, so neither the pipeline nor a document is taken for stale. Each document's text is
checkpointed as the node's item (with its ledger row) and then completes its queue item. After a kill the
resume's claims get the same documents back (keyed by queue item id), and the jobs API re-attaches to the
job instead of starting it again; a document whose checkpoint was written but whose queue item was not
completed (a kill between the two) is completed from its checkpoint. A document Textract failed on in
every attempt the jobs API allows fails its queue item for good.

Textract reads documents from S3: each is expected at ``s3://{textract_bucket}/{textract_prefix}{name}``
(uploading them is the application's part). Credentials come from botocore's own chain.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from recovery_ext import (ClassifiedError, HeartbeatSettings, NodeContext, TextractJobs, Watchdog, redact,
                          run_provider_job)
from recovery_ext.store import ItemStatus
from recovery_pipelines.ocr_engine import boost


class TextractDrain:
    """Claim the claimable documents, run them as one Textract provider job, complete each; again until none
    of the pipeline's documents is left (others' may be held elsewhere or wait for a retry)."""

    def __init__(self, ctx: NodeContext, queue: str, own_ids: list[int], item_settings: HeartbeatSettings,
                 config: Any, wait_for_documents: Any) -> None:
        self.ctx, self.queue, self.own_ids, self.config = ctx, ctx.queue(queue), own_ids, config
        self.item_settings = item_settings
        self.wait_for_documents = wait_for_documents  # the local drain's wait, shared
        self.held: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.jobs = TextractJobs.connect(region_name=config.textract_region,
                                         endpoint_url=config.textract_endpoint_url or None,
                                         price_per_page=config.textract_price_per_page)

    def run(self) -> None:
        worker = f"{self.ctx.context.run_id}:{os.getpid()}:textract"
        while True:
            self.ctx.check()
            claimed = self.queue.claim(worker, limit=max(1, len(self.own_ids)),
                                       heartbeat_timeout=self.item_settings.timeout,
                                       legacy_stale_seconds=self.config.legacy_stale_seconds)
            if claimed:
                self.recognise(claimed)
            elif not self.wait_for_documents():
                return

    def recognise(self, claimed: list[Any]) -> None:
        ctx = self.ctx
        with self.lock:
            self.held = {str(item.id): item for item in claimed}
        checkpointed = ctx.completed_items()
        for key in [k for k in self.held if k in checkpointed]:  # killed between the checkpoint and the queue
            kept = checkpointed[key]
            if isinstance(kept, dict) and "raw_text" in kept:
                self.complete(key, kept)
            else:
                self.fail(key, str((kept or {}).get("error") or "provider_job"))
        requests = {key: {"S3Object": {"Bucket": self.config.textract_bucket,
                                       "Name": f"{self.config.textract_prefix}{item.payload['name']}"}}
                    for key, item in self.held.items()}
        beat = Watchdog(self.beat, self.item_settings, name="ocr-textract-items")
        try:
            with beat:
                done = run_provider_job(ctx, self.jobs, requests, keep=self.keep,
                                        poll_seconds=self.config.provider_poll_seconds,
                                        max_attempts=self.config.provider_max_attempts)
        except ClassifiedError as exc:
            if exc.category != "provider_job":
                raise
            done = len([k for k in requests if k not in self.held])
            error = f"provider_job: {redact(exc)}"
            for key in list(self.held):
                # the node's record of the document first (no text: degraded), so a kill before the queue's
                # failure is finished from it; the node never waits for a document the queue gave up on
                ctx.checkpoint(key, {"error": error}, status=ItemStatus.DEGRADED)
                ctx.count_items("degraded", -1)
                self.fail(key, error)
        # A document counts once, as its queue item: its checkpoint (the jobs API's own record) is not counted.
        ctx.count_items("done", -done)

    def keep(self, key: str, answer: dict[str, Any]) -> None:
        result = {"raw_text": answer["text"], "boosted_text": boost(answer["text"]), "pages": answer["pages"],
                  "confidence": round(answer["confidence"], 4), "provider_job": answer["job_id"]}
        self.ctx.checkpoint(key, result)
        self.complete(key, result)

    def complete(self, key: str, result: dict[str, Any]) -> None:
        with self.lock:
            item = self.held.pop(key)
        self.queue.complete(item, result)
        self.ctx.log.info(f"document {item.payload.get('name')} ({item.id}) recognised by Textract: "
                          f"{result['pages']} page(s), confidence {result['confidence']:.2f}")

    def fail(self, key: str, error: str) -> None:
        with self.lock:
            item = self.held.pop(key)
        state = self.queue.fail(item, error, retryable=False)
        self.ctx.log.warning(f"document {item.payload.get('name')} ({item.id}): Textract failed on it in every "
                             f"attempt; now {state}")

    def beat(self) -> None:
        with self.lock:
            held = list(self.held.values())
        for item in held:
            self.queue.heartbeat(item, timeout=self.item_settings.timeout)
