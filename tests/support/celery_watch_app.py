"""A Celery app for tests/test_corroborated_liveness.py: the shipped app plus one task that starts a node
in a pool process and then lives on, as a step of dagster-celery does."""

from __future__ import annotations

import time

from recovery_ext import make_celery_app
from recovery_ext._store.models import Ownership
from recovery_ext._store.store import RecoveryStore

app = make_celery_app()


@app.task(name="rx_test.start_node")
def start_node(url: str, pipeline: int, epoch: int, owner: str, name: str) -> None:
    RecoveryStore(url).pipelines.start_node(Ownership(pipeline, epoch, owner), name, heartbeat_timeout=60)
    time.sleep(600)
