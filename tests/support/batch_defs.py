"""The provider-job tests' code location: the crash demo's batch job (recovery_pipelines/demo_batch.py), run by
tests/journal_run.py in a process a test can kill."""

from recovery_pipelines.demo_batch import job

__all__ = ["job"]
