"""recovery-ext: crash recovery for long-running Dagster LLM and OCR pipelines.

The everyday names are importable from here: the decorators and resources, the sensors, the errors, the
provider and journal API, and the classifier. Advanced APIs live in two public submodules, as Temporal's SDK
does: :mod:`recovery_ext.store` (the store, its value types, statuses and column types, the scan) and
:mod:`recovery_ext.testing` (``execute_in_process``, the environment readers). Every other module is private.
A name that moved keeps answering here, with a DeprecationWarning, for one release.
The Dagster layer loads on first use, so the CLI and pure-Python users (the classifier,
the store) do not pay for importing Dagster.
"""

from __future__ import annotations

import importlib
import warnings
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
from recovery_ext._providers.azure_document_jobs import AzureDocumentJobs
from recovery_ext._providers.gemini_batch import GeminiBatchJobs
from recovery_ext._providers.guard import CircuitOpen, OutageBudgetExceeded, OutageSettings, ProviderGuard
from recovery_ext._providers.http_answers import UnreadableAnswer
from recovery_ext._providers.jobs import (JobAdapter, JobResult, JobResults, ReadLimits, ResultUnbounded,
                                          ResultUnreadable)
from recovery_ext._providers.journal import ajournaled_call, journaled_call
from recovery_ext._providers.openai_batch import OpenAIBatchJobs
from recovery_ext._providers.ledger import record_provider_call
from recovery_ext._providers.prices import Prices
from recovery_ext._providers.textract_jobs import TextractJobs
from recovery_ext._providers.usage import UsageDetails, read_usage, read_usage_details
from recovery_ext._store.models import ProviderLimits
from recovery_ext._store.models import ProviderCall

# The Dagster layer: name -> private module that defines it, imported on first access.
_DAGSTER_API = {
    "ASSET_JOB": "sensors",
    "ExecutorFence": "fences",
    "Item": "context",
    "ItemsFailed": "parallel",
    "LLMResource": "llm",
    "MapResult": "parallel",
    "NodeContext": "context",
    "QueueHandle": "queue_handle",
    "RecoveryResource": "resources",
    "TAG_PIPELINE": "tags",
    "TAG_RESUME_NUMBER": "tags",
    "TAG_RESUMED_FROM": "tags",
    "async_journaling_http_client": "llm",
    "celery_executor_config": "celery_exec",
    "celery_settings": "celery_exec",
    "journaling_http_client": "llm",
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
    from recovery_ext._dagster.llm import LLMResource, async_journaling_http_client, journaling_http_client
    from recovery_ext._dagster.parallel import ItemsFailed, MapResult
    from recovery_ext._dagster.executor import recoverable_job, with_recovery
    from recovery_ext._dagster.fences import ExecutorFence, register_executor_fence
    from recovery_ext._dagster.provider_jobs import run_provider_job
    from recovery_ext._dagster.providers import provider_guard
    from recovery_ext._dagster.queue_handle import QueueHandle
    from recovery_ext._dagster.recoverable import recoverable_op
    from recovery_ext._dagster.resources import RecoveryResource
    from recovery_ext._dagster.sensors import ASSET_JOB, make_orphan_sensor, make_stuck_item_sensor
    from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM


# Names that moved to a public submodule: each still answers here, with a DeprecationWarning, until the next
# release removes it.
_MOVED = {
    **dict.fromkeys(["LEGACY_STALE_SECONDS", "WAITING", "BreakerState", "DbJson", "DbTime", "ItemCheckpoint",
                     "ItemOutcome", "ItemStatus", "NodeSpec", "NodeStatus", "Ownership", "PassPlan", "PipelineLimits",
                     "PipelineStatus", "QueueStatus", "RecoverySettings", "RecoveryStore", "Scope", "scan",
                     "validate_backoff"], "recovery_ext.store"),
    **dict.fromkeys(["env_bool", "env_seconds", "execute_in_process"], "recovery_ext.testing"),
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"recovery_ext.{name} moved to {_MOVED[name]}.{name}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    module = _DAGSTER_API.get(name)
    if module is None:
        raise AttributeError(f"module 'recovery_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"recovery_ext._dagster.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ASSET_JOB",
    "AnthropicBatchJobs",
    "AzureDocumentJobs",
    "BedrockBatchJobs",
    "CircuitOpen",
    "Classification",
    "ClassifiedError",
    "ConfigurationError",
    "EscalatedError",
    "ExecutorFence",
    "GeminiBatchJobs",
    "HeartbeatSettings",
    "IllegalTransition",
    "Item",
    "ItemTakenOver",
    "ItemsFailed",
    "JobAdapter",
    "JobResult",
    "JobResults",
    "LLMResource",
    "MapResult",
    "MigrationError",
    "MissingRunLiveness",
    "NodeContext",
    "NotFound",
    "OpenAIBatchJobs",
    "OutageBudgetExceeded",
    "OutageSettings",
    "OwnershipLost",
    "Prices",
    "ProviderCall",
    "ProviderGuard",
    "ProviderLimits",
    "QueueHandle",
    "ReadLimits",
    "RecoveryError",
    "RecoveryResource",
    "ResultUnbounded",
    "ResultUnreadable",
    "RetryPolicy",
    "StopRequested",
    "StoreError",
    "StoreUnavailable",
    "TAG_PIPELINE",
    "TAG_RESUMED_FROM",
    "TAG_RESUME_NUMBER",
    "TextractJobs",
    "UnfinishedItems",
    "UnreadableAnswer",
    "UnresumableSelection",
    "UsageDetails",
    "Watchdog",
    "ajournaled_call",
    "async_journaling_http_client",
    "celery_executor_config",
    "celery_settings",
    "classify",
    "instrument_opentelemetry",
    "is_retryable",
    "journaled_call",
    "journaling_http_client",
    "make_celery_app",
    "make_orphan_sensor",
    "make_stuck_item_sensor",
    "provider_guard",
    "read_usage",
    "read_usage_details",
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
    "stop_after_same_error",
    "uninstrument_opentelemetry",
    "wait_jittered_exponential",
    "with_context",
    "with_recovery",
]
