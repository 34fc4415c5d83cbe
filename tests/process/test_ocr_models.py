"""The OCR job and assets with their real ONNX models (RapidOCR) on scanned PDFs, on SQLite and PostgreSQL: the
text they recognise offline, several runs draining one queue with each document recognised once, and each asset
partition its own pipeline. Seconds of model inference per document, so these live here, not in tests/dagster
(whose OCR test replaces the engine with a function that fails)."""

from __future__ import annotations

import difflib
import socket
import threading

import pytest
from dagster import AssetKey, Definitions
from shipped_jobs import ocr_job_for, recovery

from recovery_ext import RecoveryResource, execute_in_process
from recovery_pipelines import ocr as ocr_module
from recovery_pipelines import ocr_assets
from recovery_pipelines.ocr_engine import model_files
from recovery_pipelines.sample_data import create_scanned_pdfs


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scans")
    return folder, create_scanned_pdfs(folder)


@pytest.fixture
def no_network(monkeypatch):
    """Refuse every connection that is not to this machine, to prove nothing is downloaded."""
    real = socket.socket.connect
    attempts = []

    def guarded(sock, address):
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(host)
            raise OSError(f"network disabled in this test: {host}")
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return attempts


def test_ocr_job_recognises_the_scans_offline(store, db_url, scans, no_network):
    folder, expected = scans
    assert {p.name for p in model_files()} >= {"ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"}
    result = execute_in_process(ocr_job_for(folder, workers=2), resources={"recovery": recovery(db_url)})
    assert result.success and no_network == []
    items = store.queue.list_items("ocr")
    assert len(items) == len(expected) and {i.status for i in items} == {"completed"}
    for item in items:
        ratio = difflib.SequenceMatcher(None, expected[item.payload["name"]].lower(),
                                        item.result["boosted_text"].lower()).ratio()
        assert ratio >= 0.85, (item.payload["name"], item.result["boosted_text"])
        assert item.result["raw_text"] and item.completed_at is not None and item.last_error is None
    assert store.reports.list_pipelines()[0].status == "completed"


def test_several_runs_drain_one_queue_and_no_document_completes_twice(store, db_url, scans, monkeypatch):
    folder, expected = scans
    calls = []
    real = ocr_module.recognise

    def counting(path, **kw):
        calls.append(path.name)
        return real(path, **kw)

    monkeypatch.setattr(ocr_module, "recognise", counting)
    job = ocr_job_for(folder, workers=2)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        execute_in_process(job, resources={"recovery": recovery(db_url)}))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 2 and all(r.success for r in results)
    assert sorted(calls) == sorted(expected)  # each document recognised exactly once
    assert {i.status for i in store.queue.list_items("ocr")} == {"completed"}
    claims = [t for t in store.reports.transitions_for(entity_type="queue_item") if t["event"] == "claimed"]
    assert len(claims) == len(expected)


def materializations(instance, key: str):
    return [r.asset_materialization for r in instance.fetch_materializations(AssetKey(key), limit=100).records]


def test_each_partition_of_the_ocr_assets_is_its_own_pipeline_with_its_own_checkpoints(
        db_url, instance, store, tmp_path):
    create_scanned_pdfs(tmp_path, {f"scan-{i}.pdf": [f"Invoice {i}", "Total 12 EUR"] for i in range(3)})
    partitions = ocr_assets.batch_partitions(tmp_path, batch_size=2)
    assert partitions.get_partition_keys() == ["batch-000", "batch-001"]
    assets, job = ocr_assets.make_ocr_assets(partitions)
    assert assets[0].op.pool == "ocr" and assets[0].op.retry_policy.max_retries == 3  # passed through to Dagster
    recovery = RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=5.0)
    defs = Definitions(assets=assets, jobs=[job], resources={
        "recovery": recovery, "scans": ocr_assets.ScanFolder(folder=str(tmp_path), batch_size=2)})
    job_def = defs.resolve_job_def("ocr_batches_job")
    results = {key: execute_in_process(job_def, instance=instance, partition_key=key)
               for key in ("batch-001", "batch-000")}
    assert all(r.success for r in results.values())
    by_run = {p.origin_run_id: p for p in store.reports.list_pipelines()}
    assert len(by_run) == 2
    for key, result in results.items():
        items = store.pipelines.completed_items(by_run[result.run_id].id, "ocr_batches")
        assert sorted(items) == (["scan-0.pdf", "scan-1.pdf"] if key == "batch-000" else ["scan-2.pdf"])
        assert "Invoice" in result.asset_value("ocr_batches")[sorted(items)[0]]
    stats = {m.partition: m.metadata for m in materializations(instance, "ocr_batch_stats")}
    assert stats["batch-000"]["documents"].value == 2 and stats["batch-001"]["documents"].value == 1
