"""What the provider-outage tests share: an injected clock whose sleep advances it, a scripted OpenAI-compatible
server's answers, and enrichers behind a plain or a store-backed guard."""

from __future__ import annotations

from werkzeug import Response

from recovery_ext._classify.retry import RetryPolicy
from recovery_ext._providers.guard import OutageSettings, ProviderGuard, StorePause
from recovery_pipelines.llm import OpenAICompatibleEnricher

NOW = 1_900_000_000.0  # the injected wall clock for HTTP dates


class FakeTime:
    """An injected clock whose sleep advances it: exact waits, no real sleeping."""

    def __init__(self, on_sleep=None):
        self.now = 0.0
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(seconds)


def answer(status=200, retry_after=None):
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    if status == 200:
        return Response('{"id":"1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
                        '"finish_reason":"stop","message":{"role":"assistant","content":"{\\"ok\\": true}"}}]}',
                        content_type="application/json")
    return Response('{"error":{"message":"busy"}}', status=status, headers=headers, content_type="application/json")


def serve(httpserver, responses):
    """Answer POSTs in order; the last answer repeats."""
    seen = []

    def handler(request):
        seen.append(request.path)
        return responses[min(len(seen), len(responses)) - 1]

    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(handler)
    return seen


def enricher(httpserver, *, guard_for=None, max_delay=30.0):
    policy = RetryPolicy(initial_delay=1.0, max_delay=max_delay, jitter=0.0, clock=lambda: NOW)
    base = httpserver.url_for("/v1").rstrip("/")
    guard = guard_for(base, policy) if guard_for else None
    return OpenAICompatibleEnricher(base, "m", "sk-test", 5.0, policy, guard)


def plain_guard(fake, **settings):
    def build(base, policy):
        return ProviderGuard(base, policy=policy, settings=OutageSettings(**{"jitter": 0.0, **settings}),
                             sleep=fake.sleep, clock=fake.clock)
    return build


def store_guard(fake, store, own, node="n", **settings):
    """A guard that pauses ``own`` in the store (no jitter; a breaker that does not open unless asked)."""
    def build(base, policy):
        return ProviderGuard(base, policy=policy, store=store, pause=StorePause(store, own, node), sleep=fake.sleep,
                             clock=fake.clock,
                             settings=OutageSettings(**{"jitter": 0.0, "breaker_threshold": 100, **settings}))
    return build
