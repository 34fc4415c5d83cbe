"""Everything ``definitions.py`` assembles: both jobs, the partitioned OCR assets, their sensors and resources."""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, multiprocess_executor

from ..env import env_bool, env_seconds
from ..integration import ASSET_JOB, RecoveryResource, make_orphan_sensor, make_stuck_item_sensor, with_recovery
from .llm import LLMResource
from .ocr import DEFAULT_QUEUE, make_ocr_job
from .ocr_assets import ScanFolder, batch_partitions, make_ocr_assets
from .ontology import SOURCE_URL_ENV, SourceDatabase, make_ontology_job
from .sample_data import prepare_demo, sample_db_url, scans_dir


def _env_or_none(name: str):
    """An ``EnvVar`` when the variable is set, so secrets are read at run time and never stored in config."""
    return EnvVar(name) if os.environ.get(name) else None


def build_definitions(*, prepare_inputs: bool = False) -> Definitions:
    """Both jobs and the OCR batch assets on the demo inputs by default (``recovery-ext demo setup``
    creates them; `make dev` runs it)."""
    if prepare_inputs:
        prepare_demo()
    ontology = make_ontology_job()
    # The source URL may hold a password: an EnvVar is resolved at run time and stored as its name only.
    source = SourceDatabase(url=EnvVar(SOURCE_URL_ENV) if os.environ.get(SOURCE_URL_ENV) else sample_db_url())
    folder = os.environ.get("RECOVERY_OCR_FOLDER") or str(scans_dir())
    ocr = make_ocr_job(folder)
    ocr_assets, ocr_batches_job = make_ocr_assets(batch_partitions(folder, batch_size=2))
    recovery = RecoveryResource(
        database_url=_env_or_none("RECOVERY_DATABASE_URL"),
        heartbeat_interval=env_seconds("RECOVERY_HEARTBEAT_INTERVAL", 30.0),
        heartbeat_timeout=env_seconds("RECOVERY_ORPHAN_HEARTBEAT_THRESHOLD", 90.0),
        enable_orphan_recovery=env_bool("RECOVERY_ENABLE_ORPHAN_RECOVERY", True),
    )
    llm = LLMResource(base_url=_env_or_none("RECOVERY_LLM_BASE_URL"), api_key=_env_or_none("OPENAI_API_KEY"),
                      model=os.environ.get("RECOVERY_LLM_MODEL", "gpt-4o-mini"))
    interval = int(env_seconds("RECOVERY_SENSOR_INTERVAL", 15))
    sensors = [
        make_orphan_sensor([ontology, ocr, ocr_batches_job], minimum_interval_seconds=interval),
        make_orphan_sensor([ASSET_JOB], minimum_interval_seconds=interval),  # asset backfills of the OCR assets
        make_stuck_item_sensor(ocr, DEFAULT_QUEUE, minimum_interval_seconds=60, stale_after_seconds=600),
    ]
    # executor: what the implicit asset job runs with (materializing from the UI, asset backfills)
    return Definitions(jobs=[ontology, ocr, ocr_batches_job], assets=ocr_assets, sensors=sensors,
                       executor=with_recovery(multiprocess_executor),
                       resources={"recovery": recovery, "llm": llm, "source": source,
                                  "scans": ScanFolder(folder=folder, batch_size=2)})
