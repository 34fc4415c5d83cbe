"""A run worker of tests/journal_defs.py in its own process, so a test can kill -9 it:
``python journal_run.py RUN_CONFIG_JSON``."""

from __future__ import annotations

import json
import sys
import tempfile

import journal_defs
from dagster import DagsterInstance
from ledger_defs import llm_resource, recovery_resource

from recovery_ext import execute_in_process

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        result = execute_in_process(journal_defs.journal_job, run_config=json.loads(sys.argv[1]), instance=instance,
                                    resources={"recovery": recovery_resource(), "llm": llm_resource()},
                                    raise_on_error=False)
        print(json.dumps({"run_id": result.run_id, "success": result.success}), flush=True)
