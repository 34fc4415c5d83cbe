"""recovery-ext: crash recovery for long-running Dagster LLM and OCR pipelines."""

from .classify import Classification, ClassifiedError, classify, is_retryable, with_context
from .errors import ConfigurationError, IllegalTransition, OwnershipLost, RecoveryError, StoreError, StoreUnavailable
from .heartbeat import HeartbeatSettings, Watchdog
from .models import NodeSpec, Ownership
from .recovery import RecoverySettings, scan
from .redaction import redact
from .retry import RetryPolicy, retry_if_retryable, retrying, stop_after_same_error, wait_jittered_exponential
from .store import RecoveryStore

__all__ = [
    "Classification",
    "ClassifiedError",
    "ConfigurationError",
    "HeartbeatSettings",
    "IllegalTransition",
    "NodeSpec",
    "Ownership",
    "OwnershipLost",
    "RecoveryError",
    "RecoverySettings",
    "RecoveryStore",
    "RetryPolicy",
    "StoreError",
    "StoreUnavailable",
    "Watchdog",
    "classify",
    "is_retryable",
    "redact",
    "retry_if_retryable",
    "retrying",
    "scan",
    "stop_after_same_error",
    "wait_jittered_exponential",
    "with_context",
]
