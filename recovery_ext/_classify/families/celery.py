"""Celery (and billiard, its process pool): waiting on a result that is not ready, a task over its
time limit, a lost worker and an explicit ``Retry`` are transient; a task that is unknown, revoked,
rejected or out of retries is not."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    celery = partial(loaded_types, "celery.exceptions")
    return Family(structure=by_type([
        (celery("MaxRetriesExceededError", "NotRegistered", "TaskRevokedError", "Reject", "InvalidTaskError",
                "ImproperlyConfigured", "QueueNotFound"),
         permanent("client_error", "Celery: the task cannot run (unknown, revoked, rejected or out of retries)")),
        (celery("TimeoutError", "SoftTimeLimitExceeded", "TimeLimitExceeded"),
         transient("timeout", "Celery: timed out")),
        (celery("Retry") + celery("WorkerLostError") + loaded_types("billiard.exceptions", "WorkerLostError"),
         transient("connection", "Celery: retry requested or worker lost")),
    ]))
