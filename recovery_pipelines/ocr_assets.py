"""OCR per document batch as partitioned software-defined assets: the example to copy.

``ocr_batches`` (one partition per batch of documents of a folder) OCRs each document of its
batch as one checkpointed item: a run killed mid-batch is resumed by the orphan sensor, and the
resume OCRs only the documents the killed run did not finish. ``ocr_batch_stats`` summarises a
batch from the stored texts and returns a ``MaterializeResult``. A backfill of every batch is one
run per partition; only the interrupted partitions resume.
"""

from __future__ import annotations

import math
from pathlib import Path

from dagster import (
    Config,
    ConfigurableResource,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    StaticPartitionsDefinition,
    define_asset_job,
    multiprocess_executor,
)

from recovery_ext import NodeContext, recoverable_asset, with_recovery
from recovery_pipelines.ocr_engine import DOCUMENT_SUFFIXES, recognise

GROUP = "ocr_assets"


class ScanFolder(ConfigurableResource):
    """A folder of scanned documents, cut into batches of ``batch_size`` in name order."""

    folder: str
    batch_size: int = 2

    def documents(self) -> list[Path]:
        folder = Path(self.folder)
        if not folder.is_dir():
            raise NotADirectoryError(f"OCR input folder does not exist: {folder}")
        return sorted(p for p in folder.iterdir() if p.suffix.lower() in DOCUMENT_SUFFIXES)

    def batch(self, partition_key: str) -> list[Path]:
        index = int(partition_key.rsplit("-", 1)[1])
        return self.documents()[index * self.batch_size:(index + 1) * self.batch_size]


def batch_partitions(folder: str | Path, batch_size: int) -> StaticPartitionsDefinition:
    """``batch-000``, ``batch-001``, ...: one partition per batch of the folder's documents (read when the
    definitions load; a folder that does not exist yet gives one empty batch, so the code location loads)."""
    scans = ScanFolder(folder=str(folder), batch_size=batch_size)
    count = len(scans.documents()) if Path(folder).is_dir() else 0
    return StaticPartitionsDefinition([f"batch-{i:03d}" for i in range(max(1, math.ceil(count / batch_size)))])


class OcrBatchConfig(Config):
    """Run config of ``ocr_batches``."""

    min_confidence: float = 0.0  # documents recognised with less are recorded as degraded (asked again on resume)


def make_ocr_assets(partitions: StaticPartitionsDefinition, *, executor_def=multiprocess_executor):
    """The two partitioned assets and their asset job (``executor_def``, multiprocess by default, with
    run-level recovery)."""

    @recoverable_asset(partitions_def=partitions, group_name=GROUP, pool="ocr",
                       retry_policy=RetryPolicy(max_retries=3, delay=2.0))
    def ocr_batches(ctx: NodeContext, config: OcrBatchConfig, scans: ScanFolder) -> dict[str, str]:
        """The recognised text of every document of one batch."""
        batch = {p.name: p for p in scans.batch(ctx.context.partition_key)}
        for item in ctx.items(batch):  # only what a killed run did not finish
            result = recognise(batch[item.key])
            answer = {"text": result.boosted_text, "pages": result.pages, "confidence": result.confidence}
            if result.confidence < config.min_confidence:
                item.degrade(answer)
            else:
                item.complete(answer)
        return {name: done["text"] for name, done in ctx.completed_items().items()}

    @recoverable_asset(partitions_def=partitions, group_name=GROUP)
    def ocr_batch_stats(ctx: NodeContext, ocr_batches: dict[str, str]) -> MaterializeResult:
        """Words per document of one batch."""
        words = {name: len(text.split()) for name, text in ocr_batches.items()}
        return MaterializeResult(metadata={"documents": len(words), "words": sum(words.values()),
                                           "per_document": MetadataValue.json(words)})

    # partitions_def is redundant for Dagster, but the orphan sensor reads it to resume a partition
    job = define_asset_job("ocr_batches_job", selection=[ocr_batches, ocr_batch_stats], partitions_def=partitions,
                           executor_def=with_recovery(executor_def))
    return [ocr_batches, ocr_batch_stats], job
