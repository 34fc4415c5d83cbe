"""The shipped jobs as the in-process tests run them (tests/dagster/test_pipelines.py and
tests/process/test_ocr_models.py): short liveness and retry settings, the ontology's tables migrated, one process."""

from __future__ import annotations

from dagster import in_process_executor

from recovery_ext import RecoveryResource
from recovery_pipelines.ocr import make_ocr_job
from recovery_pipelines.ontology_schema import MIGRATIONS

FAST_RETRIES = {"retry_initial_delay": 0.2, "retry_max_delay": 0.5, "retry_jitter": 0.0, "wait_poll_interval": 0.2}


def recovery(url, **kw) -> RecoveryResource:
    settings = dict(outage_pause_initial=0.05, outage_pause_max=0.1, outage_budget_seconds=3.0,
                    breaker_cooldown=0.05, breaker_max_cooldown=0.1)
    return RecoveryResource(database_url=url, migration_packages=[MIGRATIONS], heartbeat_interval=0.5,
                            heartbeat_timeout=5, max_retries=2, retry_initial_delay=0.01, retry_max_delay=0.02,
                            **{**settings, **kw})


def ocr_job_for(folder, workers=1, **ocr_config):
    return make_ocr_job(str(folder), workers=workers, executor_def=in_process_executor,
                        ocr_config={**FAST_RETRIES, **ocr_config})
