"""Faults a real Dagster instance can be configured with (dagster.yaml), for the end-to-end tests.

``HangingTerminateRunLauncher`` is the stock ``DefaultRunLauncher`` whose ``terminate`` hangs while
a flag file exists, as a launcher trying to reach a run on a host that is gone can. The orphan
sensor calls it after its reclaim has committed, so with a short sensor gRPC timeout
(``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``) the daemon fails that tick and drops its run requests.
"""

from __future__ import annotations

import os
import time

from dagster import DefaultRunLauncher, Field


class HangingTerminateRunLauncher(DefaultRunLauncher):
    def __init__(self, inst_data=None, flag_file: str = "", hang_seconds: float = 30.0):
        super().__init__(inst_data=inst_data)
        self.flag_file = flag_file
        self.hang_seconds = hang_seconds

    @classmethod
    def config_type(cls):
        return {"flag_file": Field(str), "hang_seconds": Field(float, default_value=30.0)}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data, **config_value)

    def terminate(self, run_id):
        if self.flag_file and os.path.exists(self.flag_file):
            os.unlink(self.flag_file)  # hang once
            time.sleep(self.hang_seconds)
        return super().terminate(run_id)
