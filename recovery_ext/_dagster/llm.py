"""Provider SDK clients whose every request is journaled, budgeted, recorded and retried: ``LLMResource``
for OpenAI and Anthropic, and ``journaling_http_client`` for any SDK that takes an httpx client.

The clients may be made once and shared: the node and item a request belongs to are read when it is made,
in the calling thread or task. A node's first request makes its guard (its breaker, budget, pauses and
journal, see ``provider_guard``), kept for that node only.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from types import ModuleType
from urllib.parse import urlsplit
from typing import Any, Literal

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field, ModelWrapValidatorHandler, model_validator

from recovery_ext._classify.redaction import redact_url
from recovery_ext._classify.retry import RetryPolicy
from recovery_ext._dagster.context import NodeContext
from recovery_ext._dagster.providers import provider_guard
from recovery_ext._errors import ConfigurationError, install_hint
from recovery_ext._providers.guard import ProviderGuard
from recovery_ext._providers.prices import Prices
from recovery_ext._providers.transport import JournalingCore, transport_classes
from recovery_ext._settings import DAY, check_count, check_seconds
from recovery_ext._store.models import ProviderLimits


def _http_module(name: str | None) -> ModuleType:
    """``httpx2`` (what current OpenAI, Anthropic and Mistral SDKs take) when installed, else ``httpx``."""
    for candidate in ([name] if name else ["httpx2", "httpx"]):
        try:
            return importlib.import_module(candidate)
        except ImportError:
            continue
    raise ConfigurationError(f"no HTTP client library: install {name or 'httpx2 or httpx'} (an SDK brings its own)")


class NodeGuards:
    """The guard of each node a client's requests come from, made at the node's first request."""

    def __init__(self, endpoint: str | None, policy: RetryPolicy, limits: ProviderLimits, journal: bool,
                 prices: Prices | None = None) -> None:
        self.endpoint, self.policy, self.limits, self.journal = endpoint, policy, limits, journal
        self.prices = prices  # a spend cap in money reserves the most an estimate can cost
        self._guards: weakref.WeakKeyDictionary[NodeContext, dict[str, ProviderGuard]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, scope: Any, url: Any) -> ProviderGuard | None:
        if not isinstance(scope, NodeContext):
            return None
        endpoint = self.endpoint or redact_url(f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}")
        with self._lock:
            guards = self._guards.setdefault(scope, {})
            guard = guards.get(endpoint)
            if guard is None:
                guard = guards[endpoint] = provider_guard(scope, endpoint, self.policy, limits=self.limits,
                                                          journal=self.journal, prices=self.prices)
            return guard


def _core(http: ModuleType, *, endpoint: str | None, limits: ProviderLimits | None, policy: RetryPolicy | None,
          prices: Prices | dict[str, Any] | None, provider: str | None, answer_tokens: int,
          journal: bool) -> JournalingCore:
    table = prices if isinstance(prices, Prices) else Prices.parse(prices)
    guards = NodeGuards(redact_url(endpoint.rstrip("/")) if endpoint else None, policy or RetryPolicy(),
                        limits or ProviderLimits(), journal, table)
    return JournalingCore(http, guards, prices=table, provider=provider, answer_tokens=answer_tokens, journal=journal)


def journaling_http_client(*, endpoint: str | None = None, limits: ProviderLimits | None = None,
                           policy: RetryPolicy | None = None, prices: Prices | dict[str, Any] | None = None,
                           provider: str | None = None, answer_tokens: int = 1024, journal: bool = True,
                           transport: Any = None, http_module: str | None = None, **client_kwargs: Any) -> Any:
    """An httpx client for any provider SDK (``http_client=``): inside a recoverable node each request is
    journaled (a resume's same request is answered from the journal, not sent), reserved against
    ``limits``, retried under ``policy`` and recorded in the ledger with its usage (priced by ``prices``).
    Turn the SDK's own retries off (``max_retries=0``). ``endpoint`` names the breaker and budget (default:
    the request's scheme, host and port); ``answer_tokens`` bounds an answer whose request sets no
    ``max_tokens``; ``transport`` is the transport the requests go out through; ``http_module`` is
    ``"httpx2"`` (current OpenAI, Anthropic, Mistral SDKs; the default when installed) or ``"httpx"``."""
    http = _http_module(http_module)
    sync_transport, _ = transport_classes(http)
    core = _core(http, endpoint=endpoint, limits=limits, policy=policy, prices=prices, provider=provider,
                 answer_tokens=answer_tokens, journal=journal)
    return http.Client(transport=sync_transport(core, transport), **client_kwargs)


def async_journaling_http_client(*, endpoint: str | None = None, limits: ProviderLimits | None = None,
                                 policy: RetryPolicy | None = None, prices: Prices | dict[str, Any] | None = None,
                                 provider: str | None = None, answer_tokens: int = 1024, journal: bool = True,
                                 transport: Any = None, http_module: str | None = None,
                                 **client_kwargs: Any) -> Any:
    """The ``httpx.AsyncClient`` twin of :func:`journaling_http_client` (``AsyncOpenAI``, ``AsyncAnthropic``):
    store calls run in worker threads and waits are ``asyncio.sleep``, so the event loop is never held."""
    http = _http_module(http_module)
    _, async_transport = transport_classes(http)
    core = _core(http, endpoint=endpoint, limits=limits, policy=policy, prices=prices, provider=provider,
                 answer_tokens=answer_tokens, journal=journal)
    return http.AsyncClient(transport=async_transport(core, transport), **client_kwargs)


# The most tokens one answer may be given: far beyond any model's output limit, so above it is a typo.
MAX_ANSWER_TOKENS = 10_000_000

# The SDK of each provider: its module, the extra that installs it, its sync and async client classes.
SDKS = {"openai": ("openai", "openai", "OpenAI", "AsyncOpenAI"),
        "anthropic": ("anthropic", "anthropic", "Anthropic", "AsyncAnthropic")}


# Subclassed bare, as Dagster's own resources are: a ConfigurableResource's value is the resource itself.
class LLMResource(ConfigurableResource):  # type: ignore[type-arg]
    """OpenAI or Anthropic SDK clients whose requests are journaled, budgeted, retried and recorded.

    ``llm.get_client()`` (``OpenAI``/``Anthropic``) and ``llm.get_async_client()`` (``AsyncOpenAI``/
    ``AsyncAnthropic``) are the SDK's own clients, configured here, with the SDK's retries off: inside a
    recoverable node every request goes through the node's journal, the endpoint's shared budget and
    breaker, the shared retry policy and the ledger. Outside a node they are the plain SDK clients.
    """

    # A refused setting's error would otherwise show every field given, the API key among them.
    model_config = ConfigDict(hide_input_in_errors=True, extra="forbid")

    provider: Literal["openai", "anthropic"] = Field(
        default="openai", description="Which SDK the clients are: openai (also any OpenAI-compatible server: Groq, "
                                      "Together, vLLM, ...) or anthropic. Each SDK is its own extra.")
    base_url: str | None = Field(
        default=None, description="The API's base URL (e.g. https://api.openai.com/v1); empty: the SDK's default.")
    model: str = Field(default="gpt-4o-mini", description="The model your ops send (read it as llm.model).")
    api_key: str | None = Field(
        default=None, description="API key; pass EnvVar('OPENAI_API_KEY') or EnvVar('ANTHROPIC_API_KEY'). "
                                  "Never logged. Empty: the SDK reads its own environment variable.")
    timeout: float = Field(default=60.0, description=(
        "Seconds the client waits at each step of one request (as httpx and the SDKs count it): to connect, to "
        "send, and for each read of the answer. It does not bound the whole request: a server that keeps sending "
        "a few bytes at a time (a slow stream, keep-alive comments) holds it for longer."))
    initial_delay: float = Field(default=1.0, description="First backoff delay in seconds; doubles, with jitter.")
    max_delay: float = Field(
        default=30.0, description="Upper bound of one backoff delay in seconds, and of an honoured Retry-After.")
    max_tokens: int | None = Field(
        default=1024, description="Most tokens an answer may hold when a request sets no max_tokens (bounds its "
                                  "budget reservation).")
    requests_per_minute: int | None = Field(
        default=None, description="Requests per minute the endpoint allows, shared by every run and process.")
    tokens_per_minute: int | None = Field(
        default=None, description="Tokens per minute the endpoint allows, shared by every run and process.")
    budget_per_model: bool = Field(
        default=False, description="Each model of the endpoint has its own requests/tokens per minute budget.")
    budget_window_seconds: float = Field(
        default=60.0, description="The window the per-minute limits count over (60; smaller only to test).")
    budget_margin_seconds: float | None = Field(
        default=None, description="Added to the window after a request's answer, for clock differences (default 2 %, "
                                 "at most 1 s). A request holds its room from its reservation until one window after "
                                 "its answer, however long it takes to reach the provider.")
    journal: bool = Field(
        default=True, description="Keep each answer (fenced) before it is used, so a resume never pays for it again.")
    prices: dict[str, dict[str, float]] = Field(
        default_factory=dict, description='Price per million tokens per model, e.g. {"gpt-4o-mini": {"input": 0.15, '
                                          '"output": 0.6}}: the ledger turns tokens into cost. Unlisted: no cost.')

    @model_validator(mode="wrap")
    @classmethod
    def _validate(cls, data: Any, handler: ModelWrapValidatorHandler[LLMResource]) -> LLMResource:
        """Refuse NaN, infinities, out-of-bounds and contradictory settings when the definitions load: a timeout
        every request trips would look like a provider outage and open the endpoint's breaker for every pipeline.
        A setting given as an ``EnvVar`` is checked when a run initializes the resource with its value."""
        # the input, not the built model: pydantic turns an EnvVar into its plain name before Dagster restores it
        deferred = {name for name, value in data.items() if hasattr(value, "env_var_name")} \
            if isinstance(data, dict) else set()
        resource = handler(data)
        resource._check_settings(deferred)
        return resource

    def _check_settings(self, deferred: set[str]) -> None:
        def given(*names: str) -> bool:
            return not deferred.intersection(names)

        if self.base_url and given("base_url"):
            _check_http_url("base_url", self.base_url)
        if given("timeout"):
            check_seconds("timeout", self.timeout, maximum=DAY)
        if given("initial_delay"):
            check_seconds("initial_delay", self.initial_delay, minimum=0.0, maximum=3600.0)
        if given("max_delay"):
            check_seconds("max_delay", self.max_delay, minimum=0.0, maximum=DAY)
        if given("initial_delay", "max_delay"):
            if self.initial_delay > self.max_delay:
                raise ConfigurationError(f"initial_delay must be at most max_delay ({self.max_delay:g} s), "
                                         f"got {self.initial_delay:g}")
            self.policy()
        if self.max_tokens is not None and given("max_tokens"):
            check_count("max_tokens", self.max_tokens, minimum=1, maximum=MAX_ANSWER_TOKENS)
        if given("budget_window_seconds"):
            check_seconds("budget_window_seconds", self.budget_window_seconds, maximum=DAY)
        if given("budget_margin_seconds"):
            check_seconds("budget_margin_seconds", self.budget_margin_seconds, minimum=0.0, maximum=DAY,
                          allow_none=True)
        if given("requests_per_minute", "tokens_per_minute", "budget_window_seconds", "budget_margin_seconds"):
            self.limits()  # the requests and tokens per minute, and the margin against the window
        Prices.parse(self.prices)  # before any run pays for a call it would price

    def limits(self) -> ProviderLimits:
        return ProviderLimits(requests_per_minute=self.requests_per_minute, tokens_per_minute=self.tokens_per_minute,
                              per_model=self.budget_per_model, window_seconds=self.budget_window_seconds,
                              margin_seconds=self.budget_margin_seconds)

    def policy(self) -> RetryPolicy:
        return RetryPolicy(initial_delay=self.initial_delay, max_delay=self.max_delay)

    def http_client(self, *, asynchronous: bool = False) -> Any:
        """The journaling httpx client the SDK clients are given."""
        make = async_journaling_http_client if asynchronous else journaling_http_client
        return make(endpoint=self.base_url, limits=self.limits(), policy=self.policy(), prices=self.prices,
                    provider=self.provider, answer_tokens=self.max_tokens or 0, journal=self.journal,
                    timeout=self.timeout)

    def _sdk_client(self, asynchronous: bool) -> Any:
        module_name, extra, sync_name, async_name = SDKS[self.provider]
        try:
            sdk = importlib.import_module(module_name)
        except ImportError:
            raise ConfigurationError(f"LLMResource(provider={self.provider!r}) needs the {module_name} SDK: "
                                     f"{install_hint(extra)}") from None
        cls = getattr(sdk, async_name if asynchronous else sync_name)
        options: dict[str, Any] = {"max_retries": 0, "timeout": self.timeout,
                                   "http_client": self.http_client(asynchronous=asynchronous)}
        if self.api_key:
            options["api_key"] = self.api_key
        if self.base_url:
            options["base_url"] = self.base_url
        return cls(**options)

    def get_client(self, context: Any = None) -> Any:
        """The SDK's synchronous client (``openai.OpenAI`` or ``anthropic.Anthropic``). ``context`` is accepted
        as ``dagster-openai`` takes it and not needed: the node comes from the calling thread."""
        return self._sdk_client(False)

    def get_async_client(self, context: Any = None) -> Any:
        """The SDK's asynchronous client (``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic``)."""
        return self._sdk_client(True)


def _check_http_url(name: str, value: object) -> str:
    """``value`` as an ``http://`` or ``https://`` URL with a host; the refusal shows it with its secrets masked."""
    if isinstance(value, str) and value == value.strip():
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - reading it refuses a port that is not a number from 0 to 65535
        except ValueError:
            pass
        else:
            if parts.scheme in ("http", "https") and parts.hostname:
                return value
    shown = repr(redact_url(value)) if isinstance(value, str) else repr(value)
    if len(shown) > 80:
        shown = f"{shown[:60]}... ({len(shown)} chars)"
    raise ConfigurationError(f"{name} must be an http:// or https:// URL with a host "
                             f"(e.g. https://api.openai.com/v1), got {shown}")
