"""A run worker in its own process, so a test can kill -9 it with many calls in flight:
``python parallel_run.py JOB RUN_CONFIG_JSON [RESOURCE_SETTINGS_JSON]`` runs ``parallel_defs.JOB`` with the
recovery resource of ledger_defs (``RECOVERY_DATABASE_URL``; the settings given override its own, a spend cap say)
against the stand-in at ``PARALLEL_URL``."""

from __future__ import annotations

import json
import sys
import tempfile

from dagster import DagsterInstance
from ledger_defs import recovery_resource

import parallel_defs
from recovery_ext import execute_in_process

if __name__ == "__main__":
    job = getattr(parallel_defs, sys.argv[1])
    settings = sys.argv[3] if len(sys.argv) > 3 else "{}"
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        result = execute_in_process(job, run_config=json.loads(sys.argv[2]), instance=instance,
                                    resources={"recovery": recovery_resource(**json.loads(settings))},
                                    raise_on_error=False)
        print(json.dumps({"run_id": result.run_id, "success": result.success}), flush=True)
