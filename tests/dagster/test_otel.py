"""OpenTelemetry for provider calls: real recoverable runs through the LLM resource against a stand-in
provider on 127.0.0.1, read back through the real SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from dagster import DagsterInstance, in_process_executor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ledger_defs import llm_resource, make_ledger_job, recovery_resource
from stand_in_llm import StandInProvider

import recovery_ext
from recovery_ext import (ConfigurationError, ProviderCall, RecoveryError, UsageDetails, execute_in_process,
                          instrument_opentelemetry, read_usage_details, record_provider_call,
                          uninstrument_opentelemetry)
from recovery_ext._errors import install_hint
from recovery_ext._observe.otel import DURATION_BUCKETS, TOKEN_BUCKETS, server_of
from recovery_ext._store.store import RecoveryStore
from recovery_pipelines.devserver import wait_for
import store_rows

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parents[1] / "support"
API_KEY = "sk-otel-test-4f1c9e"
PASSWORD = "pa55-otel-9d2b"
TOKEN = "qp-otel-77e3a1"  # a key in the query string


class Telemetry:
    """A tracer and a meter provider of the SDK, recording in memory, that the instrumentation writes to."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self) -> list:
        return list(self.spans.get_finished_spans())

    def points(self) -> dict[str, list]:
        """Every histogram data point collected so far, by metric name (the reader's cumulative view)."""
        found: dict[str, list] = defaultdict(list)
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name].extend((metric.unit, p) for p in metric.data.data_points)
        return found

    def token_sums(self) -> dict[str, int]:
        sums: dict[str, int] = defaultdict(int)
        for unit, point in self.points()["gen_ai.client.token.usage"]:
            assert unit == "{token}"
            sums[point.attributes["gen_ai.token.type"]] += point.sum
        return dict(sums)

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def telemetry():
    """Providers of this test only (the global ones can be set once per process), the instrumentation on."""
    uninstrument_opentelemetry()
    t = Telemetry()
    assert instrument_opentelemetry(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    try:
        yield t
    finally:
        uninstrument_opentelemetry()
        t.close()


def secret_url(url: str) -> str:
    """The stand-in's URL with a password in its userinfo and a key in its query string."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://reader:{PASSWORD}@{rest}?api_key={TOKEN}"


def run_ledger_job(db_url: str, llm_url: str, items: int, monkeypatch, **llm) -> str:
    """The ledger job in this process: ``items`` calls in ``ask`` (one per item) and one in ``summarize``."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(make_ledger_job(in_process_executor), instance=instance,
                                    run_config={"ops": {"ask": {"config": {"items": items}}}},
                                    resources={"recovery": recovery_resource(),
                                               "llm": llm_resource(llm_url, api_key=API_KEY, **llm)})
    assert result.success
    return result.run_id


def ledger_rows(db_url: str, expected: int) -> list[ProviderCall]:
    """The ledger's calls, once all ``expected`` are written (an unanswered one goes by the background writer)."""
    store = RecoveryStore(db_url)
    try:
        return wait_for(lambda: (rows := store_rows.provider_calls(store)) and len(rows) == expected and rows,
                        timeout=30, what=f"{expected} calls in the ledger")
    finally:
        store.close()


def assert_no_secret(spans, telemetry: Telemetry) -> None:
    shown = [str(v) for s in spans for v in (s.name, *s.attributes.values())]
    shown += [str(v) for points in telemetry.points().values() for _, p in points for v in p.attributes.values()]
    for secret in (API_KEY, PASSWORD, TOKEN):
        assert not [text for text in shown if secret in text], secret


def test_each_call_of_a_run_is_one_client_span_and_the_token_histogram_equals_what_the_provider_charged(
        sqlite_url, telemetry, monkeypatch):
    with StandInProvider() as provider:
        run_id = run_ledger_job(sqlite_url, secret_url(provider.url), 3, monkeypatch)
    counted = provider.totals()
    assert counted["calls"] == 4 and not provider.refused()
    rows = {row.id: row for row in ledger_rows(sqlite_url, 4)}

    spans = telemetry.finished()
    assert len(spans) == 4  # each call once: the resource records through record_provider_call, never twice
    assert {s.attributes["recovery.call_id"] for s in spans} == set(rows)
    port = int(provider.url.split(":")[2].split("/")[0])
    for span in spans:
        row = rows[span.attributes["recovery.call_id"]]
        assert span.name == "chat m"
        assert span.kind == SpanKind.CLIENT
        assert span.status.status_code == StatusCode.UNSET
        assert span.instrumentation_scope.name == "recovery_ext"
        a = span.attributes
        assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"],
                a["gen_ai.response.model"]) == ("chat", "openai", "m", "m")
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", port)
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (row.tokens_in, row.tokens_out)
        assert (a["recovery.pipeline_id"], a["recovery.node"], a["recovery.run_id"], a["recovery.epoch"]) == \
            (row.pipeline_id, row.node_name, run_id, row.epoch)
        assert a.get("recovery.item") == row.item_key
        assert a["recovery.cost"] == pytest.approx(row.cost)
        assert "error.type" not in a
        # the span covers the call itself: its recorded latency, to the nanosecond
        assert span.end_time - span.start_time == int(row.latency_seconds * 1e9)
    assert sorted(s.attributes.get("recovery.item") for s in spans if s.attributes["recovery.node"] == "ask") == \
        ["t00", "t01", "t02"]
    assert [s.attributes.get("recovery.item") for s in spans if s.attributes["recovery.node"] == "summarize"] == \
        [None]

    assert telemetry.token_sums() == {"input": counted["tokens_in"], "output": counted["tokens_out"]}
    points = telemetry.points()
    token_points = [p for _, p in points["gen_ai.client.token.usage"]]
    assert sum(p.count for p in token_points) == 8  # an input and an output measurement per call
    assert tuple(token_points[0].explicit_bounds) == TOKEN_BUCKETS
    for point in token_points:
        assert set(point.attributes) == {"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                                         "gen_ai.response.model", "server.address", "server.port",
                                         "recovery.node", "gen_ai.token.type"}
    # the inference token metrics say the same: counters by modality (unknown: no breakdown), histograms per call
    used = {side: [p for _, p in points[f"gen_ai.client.inference.usage.{side}_tokens"]]
            for side in ("input", "output")}
    assert {side: sum(p.value for p in found) for side, found in used.items()} == \
        {"input": counted["tokens_in"], "output": counted["tokens_out"]}
    assert {p.attributes["gen_ai.token.modality"] for found in used.values() for p in found} == {"unknown"}
    per_call = [p for _, p in points["gen_ai.client.inference.operation.input_tokens"]]
    assert sum(p.count for p in per_call) == 4 and "gen_ai.token.modality" not in per_call[0].attributes
    [(unit, *_)] = {(u,) for u, _ in points["gen_ai.client.operation.duration"]}
    assert unit == "s"
    durations = [p for _, p in points["gen_ai.client.operation.duration"]]
    assert sum(p.count for p in durations) == 4
    assert sum(p.sum for p in durations) == pytest.approx(sum(r.latency_seconds for r in rows.values()))
    assert tuple(durations[0].explicit_bounds) == DURATION_BUCKETS
    # pipelines, items and runs are unbounded: they stay off the metrics
    assert not {k for p in token_points + durations for k in p.attributes} & \
        {"recovery.pipeline_id", "recovery.item", "recovery.run_id", "recovery.call_id"}
    assert_no_secret(spans, telemetry)


@pytest.mark.parametrize("status, category", [(503, "server_error"), (429, "rate_limit")])
def test_a_failed_call_is_an_error_span_with_its_category_and_charges_no_tokens(sqlite_url, telemetry, monkeypatch,
                                                                                 status, category):
    # The first two requests fail (an outage that ends); the guard retries them, then all are answered.
    with StandInProvider(fail_first=2, fail_status=status) as provider:
        run_ledger_job(sqlite_url, secret_url(provider.url), 2, monkeypatch)
    counted = provider.totals()
    assert (len(provider.failed()), counted["calls"]) == (2, 5)
    rows = ledger_rows(sqlite_url, 5)
    failed_ids = {r.id for r in rows if r.outcome != "ok"}
    assert {r.outcome for r in rows if r.outcome != "ok"} == {category} and len(failed_ids) == 2

    spans = telemetry.finished()
    assert len(spans) == 5
    errors = [s for s in spans if s.status.status_code == StatusCode.ERROR]
    assert {s.attributes["recovery.call_id"] for s in errors} == failed_ids
    for span in errors:
        assert span.name == "chat m"
        assert span.attributes["error.type"] == category
        assert span.status.description == category
        assert (span.attributes["gen_ai.usage.input_tokens"], span.attributes["gen_ai.usage.output_tokens"]) == (0, 0)
        assert "gen_ai.response.model" not in span.attributes  # no response came
    assert all("error.type" not in s.attributes for s in spans if s not in errors)

    durations = [p for _, p in telemetry.points()["gen_ai.client.operation.duration"]]
    assert sum(p.count for p in durations if p.attributes.get("error.type") == category) == 2
    assert sum(p.count for p in durations if "error.type" not in p.attributes) == 3
    # failed operations stay out of the token histogram, as the conventions ask; the sums still match the bill
    assert telemetry.token_sums() == {"input": counted["tokens_in"], "output": counted["tokens_out"]}
    assert sum(p.count for _, p in telemetry.points()["gen_ai.client.token.usage"]) == 2 * 3
    assert_no_secret(spans, telemetry)


def test_switched_off_nothing_is_emitted_and_the_calls_are_still_recorded(sqlite_url, monkeypatch):
    uninstrument_opentelemetry()
    t = Telemetry()
    try:
        # providers exist (as in an application that configured its SDK) but nobody switched us on
        with StandInProvider() as provider:
            run_ledger_job(sqlite_url, provider.url, 2, monkeypatch)
        assert provider.totals()["calls"] == 3
        assert len(ledger_rows(sqlite_url, 3)) == 3
        assert t.finished() == [] and t.points() == {}
        # on, then off again: off means off
        assert instrument_opentelemetry(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
        uninstrument_opentelemetry()
        record_provider_call(ProviderCall(endpoint="https://llm.example/v1", model="m", tokens_in=5))
        assert t.finished() == [] and t.points() == {}
    finally:
        t.close()


def test_switching_on_twice_changes_nothing_and_a_call_outside_any_node_is_still_shown_once(telemetry):
    other = Telemetry()
    try:
        assert instrument_opentelemetry(tracer_provider=other.tracer_provider,
                                        meter_provider=other.meter_provider) is False
        assert recovery_ext.instrument_opentelemetry is instrument_opentelemetry
        call = ProviderCall(endpoint=f"https://svc:{PASSWORD}@api.example.com/v1?token={TOKEN}", model="claude-x",
                            tokens_in=11, tokens_out=7, latency_seconds=0.25, provider="anthropic",
                            operation="chat")
        assert record_provider_call(call) is False  # no node: not in a ledger, but it was made
        [span] = telemetry.finished()
        assert other.finished() == []
        assert span.name == "chat claude-x"
        assert (span.attributes["gen_ai.provider.name"], span.attributes["server.address"],
                span.attributes["server.port"]) == ("anthropic", "api.example.com", 443)
        assert "gen_ai.response.model" not in span.attributes
        assert not {k for k in span.attributes if k in ("recovery.pipeline_id", "recovery.node", "recovery.item")}
        assert span.end_time - span.start_time == 250_000_000
        assert telemetry.token_sums() == {"input": 11, "output": 7}
        assert_no_secret([span], telemetry)
    finally:
        other.close()


def test_a_client_that_names_nothing_gets_the_conventions_defaults():
    assert server_of("http://127.0.0.1:8000/v1") == ("127.0.0.1", 8000)
    assert server_of("http://user:***@llm.internal/v1") == ("llm.internal", 80)
    assert server_of("ocr-service") == (None, None)
    assert server_of("https://bad:port:x@[::1") == (None, None)


def test_a_call_without_a_url_or_a_model_is_named_by_its_operation(telemetry):
    record_provider_call(ProviderCall(endpoint="ocr-service", operation="ocr", outcome="timeout"))
    [span] = telemetry.finished()
    assert span.name == "ocr"
    assert span.attributes["gen_ai.provider.name"] == "unknown"
    assert "server.address" not in span.attributes and "gen_ai.request.model" not in span.attributes
    assert span.status.status_code == StatusCode.ERROR and span.attributes["error.type"] == "timeout"
    assert "gen_ai.client.token.usage" not in telemetry.points()


class _BrokenTracer:
    def start_span(self, *args, **kwargs):
        raise RuntimeError(f"exporter down: {API_KEY}")


class _BrokenTracerProvider:
    def get_tracer(self, *args, **kwargs):
        return _BrokenTracer()


def test_a_failing_sdk_costs_the_telemetry_never_the_work(sqlite_url, monkeypatch, caplog):
    uninstrument_opentelemetry()
    t = Telemetry()
    try:
        assert instrument_opentelemetry(tracer_provider=_BrokenTracerProvider(), meter_provider=t.meter_provider)
        with StandInProvider() as provider:
            run_ledger_job(sqlite_url, provider.url, 2, monkeypatch)
        # every call answered and in the ledger, the run succeeded; the failure was logged, not raised
        assert len(ledger_rows(sqlite_url, 3)) == provider.totals()["calls"] == 3
        warnings = [r.getMessage() for r in caplog.records if "telemetry failed" in r.getMessage()]
        assert len(warnings) == 3
        assert not [w for w in warnings if API_KEY in w]  # the exception's text is redacted in the log
    finally:
        uninstrument_opentelemetry()
        t.close()


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=HERE.parents[1], env={**os.environ, "PYTHONPATH": str(HERE.parents[1]), **env})


def test_it_writes_to_the_global_providers_the_application_configured():
    code = """
import json
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import recovery_ext

spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(tracer_provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
assert recovery_ext.instrument_opentelemetry()
recovery_ext.record_provider_call(recovery_ext.ProviderCall(endpoint="https://api.openai.com/v1", model="gpt-4o",
                                                            tokens_in=3, tokens_out=4, provider="openai"))
names = [m.name for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics for m in s.metrics]
print(json.dumps({"spans": [s.name for s in spans.get_finished_spans()], "metrics": sorted(names)}))
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"spans": ["chat gpt-4o"], "metrics": [
        "gen_ai.client.inference.operation.input_tokens", "gen_ai.client.inference.operation.output_tokens",
        "gen_ai.client.inference.usage.input_tokens", "gen_ai.client.inference.usage.output_tokens",
        "gen_ai.client.operation.duration", "gen_ai.client.token.usage"]}


def test_without_the_extra_switching_on_says_what_to_install_and_calls_go_on():
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import recovery_ext
assert "opentelemetry" not in [m for m in sys.modules if sys.modules[m] is not None]
try:
    recovery_ext.instrument_opentelemetry()
except recovery_ext.ConfigurationError as exc:
    assert isinstance(exc, recovery_ext.RecoveryError)
    print(exc)
assert recovery_ext.record_provider_call(recovery_ext.ProviderCall(endpoint="https://x.example/v1")) is False
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert install_hint("otel") in done.stdout
    assert issubclass(ConfigurationError, RecoveryError)


def test_provider_call_names_are_checked():
    with pytest.raises(ConfigurationError):
        ProviderCall(endpoint="https://x.example", operation="")
    with pytest.raises(ConfigurationError):
        ProviderCall(endpoint="https://x.example", response_model=42)  # type: ignore[arg-type]


def test_cached_and_reasoning_tokens_are_the_conventions_usage_attributes_and_counters(telemetry):
    from openai.types import CompletionUsage

    usage = CompletionUsage(prompt_tokens=120, completion_tokens=60, total_tokens=180,
                            prompt_tokens_details={"cached_tokens": 100},
                            completion_tokens_details={"reasoning_tokens": 40})
    details = read_usage_details(usage)  # OpenAI's SDK object
    assert details == UsageDetails(cache_read_tokens=100, cache_write_tokens=None, reasoning_tokens=40)
    # Anthropic's and Gemini's names, and a figure that is no token count (not said, never an error)
    assert read_usage_details({"input_tokens": 5, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 20}) \
        == UsageDetails(30, 20, None)
    assert read_usage_details({"cached_content_token_count": 7, "thoughts_token_count": 9}) == UsageDetails(7, None, 9)
    assert read_usage_details({"cache_read_input_tokens": -3}) == UsageDetails(None, None, None)
    record_provider_call(ProviderCall(endpoint="https://api.openai.com/v1", model="o4-mini", tokens_in=120,
                                      tokens_out=60, provider="openai", **details._asdict()))
    record_provider_call(ProviderCall(endpoint="https://api.anthropic.com", model="claude", tokens_in=55,
                                      tokens_out=5, provider="anthropic", cache_read_tokens=30, cache_write_tokens=20))
    spans = {s.attributes["gen_ai.request.model"]: s.attributes for s in telemetry.finished()}
    assert (spans["o4-mini"]["gen_ai.usage.input_tokens"], spans["o4-mini"]["gen_ai.usage.cache_read.input_tokens"],
            spans["o4-mini"]["gen_ai.usage.reasoning.output_tokens"]) == (120, 100, 40)
    assert "gen_ai.usage.cache_creation.input_tokens" not in spans["o4-mini"]  # not said: not invented
    assert spans["claude"]["gen_ai.usage.cache_creation.input_tokens"] == 20
    for attributes in spans.values():  # the conventions' deprecated names are never emitted
        assert not {"gen_ai.system", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"} & set(attributes)
    points = telemetry.points()

    def total(name: str) -> int:
        return sum(p.value for _, p in points[f"gen_ai.client.inference.usage.{name}"])

    assert (total("input_tokens"), total("output_tokens")) == (175, 65)  # cached and reasoning included
    assert (total("cache_read.input_tokens"), total("cache_write.input_tokens"),
            total("reasoning.output_tokens")) == (130, 20, 40)
    with pytest.raises(ConfigurationError):
        ProviderCall(endpoint="https://x", reasoning_tokens=-1)
