"""tests/process: what costs real processes or real time, though it needs no `dagster dev` — run, step and worker
processes killed (-9, SIGSTOP) and resumed, the multiprocess executor, processes racing for claims, the built
wheel migrating from a fresh venv, the OCR job's real models, quotas and outages waited out in real time beside
a CPU hog, the classifier's corpora (a dozen client libraries against real servers), the CLI, the metrics
exporter, a settings error and the walkthrough's demo as their own processes, the report in a real Chromium,
pip's resolve of a lean install, a heartbeat thread watched in real time, and every block of the README and the
docs run as a user runs it. Seconds of process starts and waits per test, so ``make test``
runs them and ``make test-fast`` does not.

The ``store``, ``db_url`` and CPU-hog fixtures come from the root conftest.
"""
