"""Running recoverable jobs in tests and scripts.

:func:`execute_in_process` is ``job.execute_in_process`` with the run-level liveness a real run worker has
(Dagster swaps in its own executor there); :func:`env_seconds` and :func:`env_bool` read the validated
durations and switches a test or a definitions file takes from the environment.
"""

from __future__ import annotations

from recovery_ext._dagster.executor import execute_in_process
from recovery_ext._settings import env_bool, env_seconds

__all__ = ["env_bool", "env_seconds", "execute_in_process"]
