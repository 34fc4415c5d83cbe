"""recovery-ext: crash recovery for long-running Dagster LLM and OCR pipelines.

Everything a Dagster user needs is importable from here; every other module is private.
The Dagster layer loads on first use, so the CLI and pure-Python users (the classifier,
the store) do not pay for importing Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from recovery_ext._classify.classifier import Classification, ClassifiedError, classify, is_retryable, with_context
from recovery_ext._classify.redaction import redact, redact_secret, redact_url
from recovery_ext._classify.rules import register_rule
from recovery_ext._classify.retry import (EscalatedError, RetryPolicy, retry_if_retryable, retrying,
                                          stop_after_same_error, wait_jittered_exponential)
from recovery_ext._errors import (ConfigurationError, IllegalTransition, ItemTakenOver, MigrationError,
                                  MissingRunLiveness, NotFound, OwnershipLost, RecoveryError, StopRequested, StoreError,
                                  StoreUnavailable, UnfinishedItems, UnresumableSelection)
from recovery_ext._liveness.heartbeat import HeartbeatSettings, Watchdog
from recovery_ext._observe.otel import instrument_opentelemetry, uninstrument_opentelemetry
from recovery_ext._providers.anthropic_batch import AnthropicBatchJobs
from recovery_ext._providers.bedrock_batch import BedrockBatchJobs
from recovery_ext._providers.gemini_batch import GeminiBatchJobs
from recovery_ext._providers.guard import CircuitOpen, OutageBudgetExceeded, OutageSettings, ProviderGuard
from recovery_ext._providers.jobs import (JobAdapter, JobResult, JobResults, ReadLimits, ResultUnbounded,
                                          ResultUnreadable)
from recovery_ext._providers.journal import journaled_call
from recovery_ext._providers.openai_batch import OpenAIBatchJobs
from recovery_ext._providers.ledger import record_provider_call
from recovery_ext._providers.prices import Prices
from recovery_ext._providers.textract_jobs import TextractJobs
from recovery_ext._recovery.protocol import scan
from recovery_ext._recovery.scan import RecoverySettings
from recovery_ext._providers.usage import read_usage
from recovery_ext._settings import env_bool, env_seconds
from recovery_ext._store.budgets import ProviderLimits
from recovery_ext._store.models import (ItemCheckpoint, NodeSpec, Ownership, PassPlan, PipelineLimits, ProviderCall,
                                        Scope)
from recovery_ext._store.queue import LEGACY_STALE_SECONDS, validate_backoff
from recovery_ext._store.schema import DbJson, DbTime
from recovery_ext._store.statuses import (WAITING, BreakerState, ItemOutcome, ItemStatus, NodeStatus, PipelineStatus,
                                          QueueStatus)
from recovery_ext._store.store import RecoveryStore

# The Dagster layer: name -> private module that defines it, imported on first access.
_DAGSTER_API = {
    "ASSET_JOB": "sensors",
    "ExecutorFence": "fences",
    "Item": "context",
    "NodeContext": "context",
    "QueueHandle": "queue_handle",
    "RecoveryResource": "resources",
    "TAG_PIPELINE": "tags",
    "TAG_RESUME_NUMBER": "tags",
    "TAG_RESUMED_FROM": "tags",
    "celery_executor_config": "celery_exec",
    "celery_settings": "celery_exec",
    "execute_in_process": "executor",
    "make_celery_app": "celery_exec",
    "make_orphan_sensor": "sensors",
    "make_stuck_item_sensor": "sensors",
    "provider_guard": "providers",
    "run_provider_job": "provider_jobs",
    "recoverable_asset": "assets",
    "recoverable_celery_executor": "celery_exec",
    "recoverable_job": "executor",
    "recoverable_multi_asset": "assets",
    "recoverable_op": "recoverable",
    "register_executor_fence": "fences",
    "with_recovery": "executor",
}

if TYPE_CHECKING:
    from recovery_ext._dagster.assets import recoverable_asset, recoverable_multi_asset
    from recovery_ext._dagster.celery_exec import (celery_executor_config, celery_settings, make_celery_app,
                                                   recoverable_celery_executor)
    from recovery_ext._dagster.context import Item, NodeContext
    from recovery_ext._dagster.executor import execute_in_process, recoverable_job, with_recovery
    from recovery_ext._dagster.fences import ExecutorFence, register_executor_fence
    from recovery_ext._dagster.provider_jobs import run_provider_job
    from recovery_ext._dagster.providers import provider_guard
    from recovery_ext._dagster.queue_handle import QueueHandle
    from recovery_ext._dagster.recoverable import recoverable_op
    from recovery_ext._dagster.resources import RecoveryResource
    from recovery_ext._dagster.sensors import ASSET_JOB, make_orphan_sensor, make_stuck_item_sensor
    from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM


def __getattr__(name: str) -> Any:
    module = _DAGSTER_API.get(name)
    if module is None:
        raise AttributeError(f"module 'recovery_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"recovery_ext._dagster.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AnthropicBatchJobs",
    "ASSET_JOB",
    "BedrockBatchJobs",
    "BreakerState",
    "CircuitOpen",
    "Classification",
    "ClassifiedError",
    "ConfigurationError",
    "DbJson",
    "DbTime",
    "EscalatedError",
    "ExecutorFence",
    "GeminiBatchJobs",
    "HeartbeatSettings",
    "IllegalTransition",
    "Item",
    "ItemCheckpoint",
    "ItemOutcome",
    "ItemStatus",
    "ItemTakenOver",
    "JobAdapter",
    "JobResult",
    "JobResults",
    "LEGACY_STALE_SECONDS",
    "MigrationError",
    "MissingRunLiveness",
    "NodeContext",
    "NodeSpec",
    "NodeStatus",
    "NotFound",
    "OpenAIBatchJobs",
    "OutageBudgetExceeded",
    "OutageSettings",
    "Ownership",
    "OwnershipLost",
    "PassPlan",
    "PipelineLimits",
    "PipelineStatus",
    "Prices",
    "ProviderCall",
    "ProviderGuard",
    "ProviderLimits",
    "QueueHandle",
    "QueueStatus",
    "ReadLimits",
    "ResultUnbounded",
    "ResultUnreadable",
    "RecoveryError",
    "RecoveryResource",
    "RecoverySettings",
    "RecoveryStore",
    "RetryPolicy",
    "Scope",
    "StopRequested",
    "StoreError",
    "StoreUnavailable",
    "TAG_PIPELINE",
    "TAG_RESUMED_FROM",
    "TAG_RESUME_NUMBER",
    "TextractJobs",
    "UnfinishedItems",
    "UnresumableSelection",
    "WAITING",
    "Watchdog",
    "celery_executor_config",
    "celery_settings",
    "classify",
    "env_bool",
    "env_seconds",
    "execute_in_process",
    "instrument_opentelemetry",
    "is_retryable",
    "journaled_call",
    "make_celery_app",
    "make_orphan_sensor",
    "make_stuck_item_sensor",
    "provider_guard",
    "read_usage",
    "record_provider_call",
    "recoverable_asset",
    "recoverable_celery_executor",
    "recoverable_job",
    "recoverable_multi_asset",
    "recoverable_op",
    "redact",
    "redact_secret",
    "redact_url",
    "register_executor_fence",
    "register_rule",
    "retry_if_retryable",
    "retrying",
    "run_provider_job",
    "scan",
    "stop_after_same_error",
    "uninstrument_opentelemetry",
    "validate_backoff",
    "wait_jittered_exponential",
    "with_context",
    "with_recovery",
]
