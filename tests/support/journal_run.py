"""A run worker in its own process, so a test can kill -9 it: ``python journal_run.py MODULE RUN_CONFIG_JSON``
runs ``MODULE.job`` (tests/journal_defs.py, tests/batch_defs.py) with the ledger tests' resources."""

from __future__ import annotations

import importlib
import json
import sys
import tempfile

from dagster import DagsterInstance
from ledger_defs import llm_resource, recovery_resource

from recovery_ext import execute_in_process

if __name__ == "__main__":
    defs = importlib.import_module(sys.argv[1])
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        result = execute_in_process(defs.job, run_config=json.loads(sys.argv[2]), instance=instance,
                                    resources={"recovery": recovery_resource(), "llm": llm_resource()},
                                    raise_on_error=False)
        print(json.dumps({"run_id": result.run_id, "success": result.success}), flush=True)
