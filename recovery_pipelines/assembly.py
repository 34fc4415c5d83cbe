"""Everything ``definitions.py`` assembles: both jobs, the partitioned OCR assets, their sensors and resources."""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, multiprocess_executor

from pydantic import ValidationError

from recovery_ext import (ASSET_JOB, ConfigurationError, RecoveryResource, make_orphan_sensor, make_stuck_item_sensor,
                          recoverable_celery_executor, with_recovery)
from recovery_ext.testing import env_bool, env_seconds
from recovery_pipelines.llm import LLMResource
from recovery_pipelines.ocr import DEFAULT_QUEUE, make_ocr_job
from recovery_pipelines.ocr_assets import ScanFolder, batch_partitions, make_ocr_assets
from recovery_pipelines.ontology import SOURCE_URL_ENV, SourceDatabase, make_ontology_job
from recovery_pipelines.ontology_schema import MIGRATIONS
from recovery_pipelines.sample_data import prepare_demo, sample_db_url, scans_dir


def _env_or_none(name: str):
    """An ``EnvVar`` when the variable is set, so secrets are read at run time and never stored in config."""
    return EnvVar(name) if os.environ.get(name) else None


# The environment variables the definitions read their settings from: named when a setting is refused.
SETTINGS_ENV = ("RECOVERY_HEARTBEAT_INTERVAL", "RECOVERY_ORPHAN_HEARTBEAT_THRESHOLD", "RECOVERY_ENABLE_ORPHAN_RECOVERY",
                "RECOVERY_SENSOR_INTERVAL", "RECOVERY_LLM_MODEL", "RECOVERY_OCR_FOLDER")

EXECUTOR_ENV = "RECOVERY_EXECUTOR"

# Per million tokens. The demo's stand-in (model demo-llm) is priced like gpt-4o-mini's list price, so
# the demo's costs, cost cards and metrics show what a crash would cost; a real model has no price here.
DEMO_PRICES = {"demo-llm": {"input": 0.15, "output": 0.6}}


def selected_executor():
    """The executor every shipped job runs on: ``RECOVERY_EXECUTOR`` = ``multiprocess`` (default) or
    ``celery`` (Dagster's Celery executor, broker and result backend from ``RECOVERY_CELERY_BROKER``
    and ``RECOVERY_CELERY_BACKEND``; workers: ``celery -A recovery_pipelines.celery_app worker``)."""
    kind = (os.environ.get(EXECUTOR_ENV) or "multiprocess").strip().lower()
    if kind == "multiprocess":
        return multiprocess_executor
    if kind == "celery":
        try:
            return recoverable_celery_executor()
        except ImportError as exc:
            raise ConfigurationError(f"{EXECUTOR_ENV}=celery needs the celery extra: "
                                     f"pip install -e '.[celery]' in the project's root ({exc})") from exc
        except ValueError as exc:
            raise ConfigurationError(f"{EXECUTOR_ENV}=celery: {exc}") from exc
    raise ConfigurationError(f"{EXECUTOR_ENV} must be multiprocess or celery, got {kind!r}")


def build_definitions(*, prepare_inputs: bool = False) -> Definitions:
    """Both jobs and the OCR batch assets on the demo inputs by default (``recovery-ext demo setup``
    creates them; `make dev` runs it).

    An invalid setting raises one :class:`ConfigurationError` naming it, without the frames and
    validation details beneath: that line is what ``dagster dev`` shows for the code location.
    """
    try:
        return _assemble(prepare_inputs)
    except (ConfigurationError, ValidationError) as exc:
        raise ConfigurationError(_settings_message(exc)) from None


def _settings_message(exc: Exception) -> str:
    if not isinstance(exc, ValidationError):
        return str(exc)
    errors = exc.errors()
    what = "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in errors) or str(exc)
    fields = ", ".join(".".join(map(str, e.get("loc", ()))) for e in errors if e.get("loc"))
    settings = ", ".join(f"{name}={os.environ[name]}" for name in SETTINGS_ENV if os.environ.get(name))
    return (f"invalid {exc.title} settings{f' ({fields})' if fields else ''}: {what}"
            + (f" [from {settings}]" if settings else ""))


def _assemble(prepare_inputs: bool) -> Definitions:
    if prepare_inputs:
        prepare_demo()
    executor = selected_executor()
    ontology = make_ontology_job(executor_def=executor)
    # The source URL may hold a password: an EnvVar is resolved at run time and stored as its name only.
    source = SourceDatabase(url=EnvVar(SOURCE_URL_ENV) if os.environ.get(SOURCE_URL_ENV) else sample_db_url())
    folder = os.environ.get("RECOVERY_OCR_FOLDER") or str(scans_dir())
    ocr = make_ocr_job(folder, executor_def=executor)
    ocr_assets, ocr_batches_job = make_ocr_assets(batch_partitions(folder, batch_size=2), executor_def=executor)
    recovery = RecoveryResource(
        database_url=_env_or_none("RECOVERY_DATABASE_URL"),
        migration_packages=[MIGRATIONS],
        heartbeat_interval=env_seconds("RECOVERY_HEARTBEAT_INTERVAL", 30.0),
        heartbeat_timeout=env_seconds("RECOVERY_ORPHAN_HEARTBEAT_THRESHOLD", 90.0),
        enable_orphan_recovery=env_bool("RECOVERY_ENABLE_ORPHAN_RECOVERY", True),
    )
    llm = LLMResource(base_url=_env_or_none("RECOVERY_LLM_BASE_URL"), api_key=_env_or_none("OPENAI_API_KEY"),
                      model=os.environ.get("RECOVERY_LLM_MODEL", "gpt-4o-mini"), prices=DEMO_PRICES)
    # Dagster evaluates a sensor at most every 5 s: a smaller interval would only understate detection time
    interval = int(env_seconds("RECOVERY_SENSOR_INTERVAL", 15, minimum=5))
    sensors = [
        make_orphan_sensor([ontology, ocr, ocr_batches_job], minimum_interval_seconds=interval),
        make_orphan_sensor([ASSET_JOB], minimum_interval_seconds=interval),  # asset backfills of the OCR assets
        make_stuck_item_sensor(ocr, DEFAULT_QUEUE, minimum_interval_seconds=60, stale_after_seconds=600),
    ]
    # executor: what the implicit asset job runs with (materializing from the UI, asset backfills)
    return Definitions(jobs=[ontology, ocr, ocr_batches_job], assets=ocr_assets, sensors=sensors,
                       executor=with_recovery(executor),
                       resources={"recovery": recovery, "llm": llm, "source": source,
                                  "scans": ScanFolder(folder=folder, batch_size=2)})
