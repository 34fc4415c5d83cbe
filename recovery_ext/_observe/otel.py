"""OpenTelemetry spans and metrics for provider calls, after the GenAI semantic conventions.

Switched on by :func:`instrument_opentelemetry` (the ``otel`` extra); until then nothing here
imports OpenTelemetry and a provider call costs one global read (see
:func:`recovery_ext._providers.ledger.observe`). Each call the ledger sees becomes:

* a span ``{gen_ai.operation.name} {gen_ai.request.model}`` (``chat gpt-4o-mini``), kind CLIENT, from
  the call's start to its end (the recording instant minus its latency, to the nanosecond), status
  ERROR with ``error.type`` when the call failed;
* ``gen_ai.client.operation.duration`` (histogram, ``s``), every call, ``error.type`` on failures;
* ``gen_ai.client.token.usage`` (histogram, ``{token}``), once per ``gen_ai.token.type`` (``input``,
  ``output``), for answered calls only: the conventions keep failed operations out of it;
* the inference token metrics (the conventions' ``gen-ai-token-metrics``), for answered calls only: the
  counters ``gen_ai.client.inference.usage.input_tokens`` and ``.output_tokens`` (cached and reasoning
  tokens included) and ``.cache_read.input_tokens``, ``.cache_write.input_tokens`` and
  ``.reasoning.output_tokens`` (when the provider said them), each with ``gen_ai.token.modality``
  (``unknown``: no provider call here breaks its usage down by modality), and the per-operation histograms
  ``gen_ai.client.inference.operation.input_tokens`` and ``.output_tokens``.

The span carries ``gen_ai.usage.input_tokens`` and ``gen_ai.usage.output_tokens`` (cached and reasoning
tokens included, as the conventions count them) and, when the provider said them,
``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.cache_creation.input_tokens`` and
``gen_ai.usage.reasoning.output_tokens``. The conventions' deprecated names (``gen_ai.system``,
``gen_ai.usage.prompt_tokens``, ``gen_ai.usage.completion_tokens``) are never emitted.

Telemetry goes through the tracer and meter providers given, else OpenTelemetry's global ones, so
the application's own SDK setup (exporters, sampling, views) applies, as with any instrumentation.
Metric attributes stay low-cardinality (the node, never a pipeline, item or run: those are on the
span). Nothing here carries a secret: the endpoint reaches us masked, and only its host and port are
used; an outcome is redacted as the ledger redacts it.
"""

from __future__ import annotations

import logging
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urlsplit

from recovery_ext._classify.redaction import redact
from recovery_ext._errors import ConfigurationError, install_hint
from recovery_ext._providers.ledger import set_observer
from recovery_ext._store.models import ProviderCall

log = logging.getLogger("recovery_ext._observe.otel")

SCOPE = "recovery_ext"
DEFAULT_OPERATION = "chat"
# The conventions' custom value for a client that did not say which provider it called.
UNKNOWN_PROVIDER = "unknown"
# The bucket boundaries the GenAI conventions advise for these two histograms.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
DEFAULT_PORTS = {"http": 80, "https": 443}
# The provider reports no breakdown of its tokens by modality: the conventions' value for that.
UNKNOWN_MODALITY = "unknown"
# The parts of a call's tokens the provider may report: (ProviderCall field, span attribute, usage counter).
TOKEN_PARTS = (("cache_read_tokens", "gen_ai.usage.cache_read.input_tokens",
                "gen_ai.client.inference.usage.cache_read.input_tokens",
                "The number of input tokens served from a provider-managed cache."),
               ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens",
                "gen_ai.client.inference.usage.cache_write.input_tokens",
                "The number of input tokens written to a provider-managed cache."),
               ("reasoning_tokens", "gen_ai.usage.reasoning.output_tokens",
                "gen_ai.client.inference.usage.reasoning.output_tokens",
                "The number of output tokens used for reasoning (e.g. chain-of-thought, extended thinking)."))

_lock = threading.Lock()
_emitter: _Emitter | None = None


def _library_version() -> str | None:
    try:
        return version("recovery-ext")
    except PackageNotFoundError:  # run from a checkout, not installed
        return None


def server_of(endpoint: str) -> tuple[str | None, int | None]:
    """``server.address`` and ``server.port`` of an endpoint URL (the scheme's port when none is given).

    Only the host and port leave here: a user name, a masked password, a path or a query never do.
    """
    try:
        parts = urlsplit(endpoint)
        host, port = parts.hostname, parts.port
    except ValueError:  # not a URL (a name a client chose, a broken port): no server attributes
        return None, None
    if not host:
        return None, None
    return host, port if port is not None else DEFAULT_PORTS.get(parts.scheme.lower())


class _Emitter:
    """Turns one recorded :class:`ProviderCall` into its span and measurements."""

    def __init__(self, tracer: Any, meter: Any, status: Any) -> None:
        from opentelemetry.trace import SpanKind

        self.tracer = tracer
        self.kind = SpanKind.CLIENT
        self.status = status  # (Status, StatusCode), imported once here, not per call
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        usage = "gen_ai.client.inference.usage"
        self.used = {
            "input": meter.create_counter(f"{usage}.input_tokens", unit="{token}", description=(
                "The number of input (prompt) tokens used, including cached tokens.")),
            "output": meter.create_counter(f"{usage}.output_tokens", unit="{token}", description=(
                "The number of output (completion) tokens used, including reasoning tokens.")),
            **{field: meter.create_counter(counter, unit="{token}", description=text)
               for field, _, counter, text in TOKEN_PARTS}}
        operation = "gen_ai.client.inference.operation"
        self.per_operation = {
            side: meter.create_histogram(f"{operation}.{side}_tokens", unit="{token}",
                                         description=f"The number of {side} tokens used per inference operation.",
                                         explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
            for side in ("input", "output")}

    def __call__(self, call: ProviderCall) -> None:
        end = time.time_ns()
        start = end - int(call.latency_seconds * 1e9)
        operation = call.operation or DEFAULT_OPERATION
        common: dict[str, Any] = {"gen_ai.operation.name": operation,
                                  "gen_ai.provider.name": call.provider or UNKNOWN_PROVIDER}
        if call.model:
            common["gen_ai.request.model"] = call.model
        if call.response_model:
            common["gen_ai.response.model"] = call.response_model
        host, port = server_of(call.endpoint)
        if host is not None:
            common["server.address"] = host
            if port is not None:
                common["server.port"] = port
        failed = call.outcome != "ok"
        error = redact(call.outcome)[:64] if failed else None

        # Metrics: the node is a bounded set (a job's ops); pipelines, items and runs are not.
        measured = dict(common)
        if call.node_name is not None:
            measured["recovery.node"] = call.node_name
        if error is not None:
            measured["error.type"] = error
        self.duration.record(call.latency_seconds, measured)
        parts = {field: getattr(call, field) for field, _, _, _ in TOKEN_PARTS}
        if not failed:
            self.token_usage.record(call.tokens_in, {**measured, "gen_ai.token.type": "input"})
            self.token_usage.record(call.tokens_out, {**measured, "gen_ai.token.type": "output"})
            self._record_usage(call, measured, parts)

        attributes = {**measured, "gen_ai.usage.input_tokens": call.tokens_in,
                      "gen_ai.usage.output_tokens": call.tokens_out, "recovery.call_id": call.id}
        for field, attribute, _, _ in TOKEN_PARTS:
            if parts[field] is not None:
                attributes[attribute] = parts[field]
        for key, value in (("recovery.pipeline_id", call.pipeline_id), ("recovery.item", call.item_key),
                           ("recovery.run_id", call.run_id), ("recovery.epoch", call.epoch),
                           ("recovery.cost", call.cost)):
            if value is not None:
                attributes[key] = value
        name = f"{operation} {call.model}" if call.model else operation
        span = self.tracer.start_span(name, kind=self.kind, start_time=start, attributes=attributes)
        if error is not None:
            status, code = self.status
            span.set_status(status(code.ERROR, error))
        span.end(end_time=end)


    def _record_usage(self, call: ProviderCall, measured: dict[str, Any], parts: dict[str, int | None]) -> None:
        """The inference token metrics of an answered call: the usage counters (by modality, each part the
        provider reported) and the per-operation histograms (no modality: their percentiles must add up)."""
        by_modality = {**measured, "gen_ai.token.modality": UNKNOWN_MODALITY}
        self.used["input"].add(call.tokens_in, by_modality)
        self.used["output"].add(call.tokens_out, by_modality)
        for field, value in parts.items():
            if value is not None:
                self.used[field].add(value, by_modality)
        self.per_operation["input"].record(call.tokens_in, measured)
        self.per_operation["output"].record(call.tokens_out, measured)


def instrument_opentelemetry(*, tracer_provider: Any = None, meter_provider: Any = None) -> bool:
    """Emit an OpenTelemetry span and GenAI metrics for every provider call from now on, in this process.

    Uses OpenTelemetry's global tracer and meter providers unless others are given, so configure the
    SDK (or run under ``opentelemetry-instrument``) as for any instrumentation. Returns True when this
    call switched it on, False when it was on already (nothing changes: call
    :func:`uninstrument_opentelemetry` first to change providers). Needs the ``otel`` extra
    (``pip install -e '.[otel]'`` in a clone); without it raises :class:`ConfigurationError`.
    """
    global _emitter
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.trace import Status, StatusCode
    except ImportError:
        raise ConfigurationError(f"OpenTelemetry is not installed: {install_hint('otel')} "
                                 "(opentelemetry-api) to emit provider-call spans and metrics") from None
    with _lock:
        if _emitter is not None:
            return False
        release = _library_version()
        tracer = trace.get_tracer(SCOPE, release, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, release or "", meter_provider=meter_provider)
        _emitter = _Emitter(tracer, meter, (Status, StatusCode))
        set_observer(_emitter)
    return True


def uninstrument_opentelemetry() -> None:
    """Stop emitting provider-call telemetry (spans already ended stay with their exporters)."""
    global _emitter
    with _lock:
        set_observer(None)
        _emitter = None

