"""A code location with the real OCR job (multiprocess executor) and the orphan sensor, for
tests/test_ocr_e2e.py under a real `dagster dev`. The kill -9s there are found through the
dead run (Dagster marks it FAILURE), not the heartbeat, whose timeout is long enough that a
step process starting up under the CPU hog is never mistaken for a crash."""

from __future__ import annotations

import os

from dagster import Definitions

from recovery_ext import RecoveryResource, make_orphan_sensor
from recovery_pipelines.ocr import make_ocr_job

ocr_job = make_ocr_job(os.environ["OCR_E2E_FOLDER"], ocr_config={
    # A held document stays held (600 s) unless its pipeline is reclaimed: only the epoch releases it.
    "item_heartbeat_interval": 0.5, "item_heartbeat_timeout": 600.0,
    "retry_initial_delay": 0.2, "retry_max_delay": 0.5, "wait_poll_interval": 0.2,
})

defs = Definitions(
    jobs=[ocr_job],
    sensors=[make_orphan_sensor([ocr_job], minimum_interval_seconds=1)],
    resources={"recovery": RecoveryResource(database_url=os.environ["RECOVERY_DATABASE_URL"], heartbeat_interval=3.0,
                                            heartbeat_timeout=30.0, max_resumes=4, launch_grace_seconds=60)},
)
