"""The classifier's verdict in Dagster's terms: retry requests, failures and their metadata."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from dagster import Failure, MetadataValue, RetryRequested

from recovery_ext._classify.classifier import ClassifiedError, with_context
from recovery_ext._store.models import ErrorInfo
from recovery_ext._classify.retry import wait_jittered_exponential


# The metadata a step that found the recovery database unavailable past the store's retry budget fails with: it
# left its node as it was, so its run leaves the pipeline to recovery instead of failing it. A key of its own: the
# category database_transient is also what a node's own database errors (a deadlock) are classified as.
DATABASE_OUTAGE: Mapping[str, str] = MappingProxyType({"recovery_database": "unavailable"})


def failure_metadata(err: ClassifiedError) -> dict[str, Any]:
    meta = err.metadata()
    return {
        "category": meta["category"],
        "status_code": MetadataValue.int(err.status_code) if err.status_code is not None else "none",
        "model": meta["model"] or "none",
        "endpoint": meta["endpoint"] or "none",
        "retryable": bool(meta["retryable"]),
    }


def to_failure(err: ClassifiedError, *, prefix: str = "") -> Failure:
    """A permanent error: fails at once, even under a RetryPolicy."""
    return Failure(description=f"{prefix}{err}", metadata=failure_metadata(err), allow_retries=False)


def to_dagster(
    exc: BaseException,
    *,
    retry_number: int,
    max_retries: int,
    wait: wait_jittered_exponential,
    model: str | None = None,
    endpoint: str | None = None,
) -> RetryRequested | Failure:
    """A retryable error becomes ``RetryRequested`` with the jittered delay, a permanent one ``Failure``."""
    err = with_context(exc, model=model, endpoint=endpoint)
    if err.retryable and retry_number < max_retries:
        return RetryRequested(max_retries=max_retries, seconds_to_wait=wait.delay(retry_number + 1))
    if err.retryable:
        err = ClassifiedError(exc, category=err.category, status_code=err.status_code, retryable=False,
                              model=err.model, endpoint=err.endpoint,
                              message=f"still failing after {max_retries} retries: {err.detail}")
    return to_failure(err)


def error_info(err: ClassifiedError) -> ErrorInfo:
    return ErrorInfo(str(err), err.category, err.status_code)
