"""tests/e2e: real servers and processes — `dagster dev` with its daemon and sensors, Celery worker hosts in
network namespaces, a private PostgreSQL cluster restarted for real, Prometheus, headless Chromium.

A module that runs under `dagster dev` names its code location and may shape its instance and environment:

- ``DEFS``: the defs file in tests/support (required);
- ``dagster_yaml(request) -> str``: the instance's dagster.yaml (default: Dagster's, without telemetry); the
  run queue looks for runs to launch every second in either;
- ``dev_env(request) -> dict``: environment on top of ``RECOVERY_DATABASE_URL`` (the module's ``app_url``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from recovery_ext._store.store import RecoveryStore
from recovery_pipelines.devserver import DagsterDev

SUPPORT = Path(__file__).resolve().parents[1] / "support"


@pytest.fixture(scope="module")
def dev(request, app_url, app_store, tmp_path_factory, cpu_hog_module) -> Iterator[DagsterDev]:
    """One `dagster dev` for the module (the application tables migrated first), on a machine kept busy by one
    CPU hog per core."""
    module = request.module
    home = tmp_path_factory.mktemp("dagster_home")
    instance = yaml.safe_load(module.dagster_yaml(request)) if hasattr(module, "dagster_yaml") else {
        "telemetry": {"enabled": False}}
    # Dagster's run queue looks for runs to launch every 5 s by default, so every launch and resume run of a
    # test would wait up to that long in it. Each second instead: which runs it admits, and in what order, is
    # unchanged.
    instance.setdefault("run_queue", {}).setdefault("dequeue_interval_seconds", 1)
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance))
    env = {"RECOVERY_DATABASE_URL": app_url, **(module.dev_env(request) if hasattr(module, "dev_env") else {})}
    server = DagsterDev(SUPPORT / module.DEFS, home, env)
    server.start(timeout=240)
    yield server
    server.stop()
    if os.environ.get("RX_KEEP_DEV_LOG"):  # RX_KEEP_DEV_LOG=path keeps the `dagster dev` log for a post-mortem
        shutil.copy(server.log_path, os.environ["RX_KEEP_DEV_LOG"])


@pytest.fixture(scope="module")
def store(app_store) -> RecoveryStore:
    """The module's application store: the one its `dagster dev` writes to."""
    return app_store
