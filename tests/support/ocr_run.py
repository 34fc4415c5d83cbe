"""Run the OCR job once in this process against a real Dagster instance (``DAGSTER_HOME``), so a
test can ``kill -9`` it: ``python ocr_run.py DB_URL FOLDER TAGS_JSON OCR_CONFIG_JSON``."""

from __future__ import annotations

import json
import sys

from dagster import DagsterInstance, in_process_executor

from recovery_ext import RecoveryResource, execute_in_process
from recovery_pipelines.ocr import make_ocr_job


def resource(db_url: str) -> RecoveryResource:
    return RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=5, max_retries=2,
                            retry_initial_delay=0.01, retry_max_delay=0.02)


def main() -> None:
    db_url, folder, tags, ocr_config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    job = make_ocr_job(folder, executor_def=in_process_executor, ocr_config=ocr_config)
    with DagsterInstance.get() as instance:
        result = execute_in_process(job, instance=instance, tags=tags, resources={"recovery": resource(db_url)},
                                        raise_on_error=False)
    print(json.dumps({"run_id": result.run_id, "success": result.success}), flush=True)


if __name__ == "__main__":
    main()
