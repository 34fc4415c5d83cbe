"""A run worker in its own process, so a test can kill -9 it: ``python ledger_run.py RUN_CONFIG_JSON [inprocess]``."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from dagster import DagsterInstance, build_reconstructable_job, execute_job

if __name__ == "__main__":
    run_config = json.loads(sys.argv[1])
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        if len(sys.argv) > 2 and sys.argv[2] == "inprocess":
            import ledger_defs
            from recovery_ext import execute_in_process

            result = execute_in_process(ledger_defs.ledger_job_inprocess, run_config=run_config, instance=instance,
                                        resources={"recovery": ledger_defs.recovery_resource(),
                                                   "llm": ledger_defs.llm_resource()}, raise_on_error=False)
        else:
            result = execute_job(build_reconstructable_job("ledger_defs", "bound_ledger_job",
                                                           reconstructor_working_directory=str(here)),
                                 instance=instance, run_config=run_config, raise_on_error=False)
        print(json.dumps({"run_id": result.run_id, "success": result.success}), flush=True)
