"""tests/process: real run, step and worker processes killed (-9, SIGSTOP) and resumed, the multiprocess executor,
and every block of the README and the docs run as a user runs it — no `dagster dev`, but seconds of process
starts and waits per test, so ``make test`` runs them and ``make test-fast`` does not.

The ``store``, ``db_url`` and CPU-hog fixtures come from the root conftest.
"""
