"""An OpenAI-compatible chat-completions client as a Dagster resource, and its offline stand-in.

Errors carry model, endpoint and status into the shared classifier. With no endpoint
configured, a deterministic heuristic enricher answers, so the demo runs offline.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Protocol

from pydantic import Field, model_validator

from recovery_ext import LLMResource as LibraryLLMResource
from recovery_ext import (ClassifiedError, ConfigurationError, NodeContext, Prices, ProviderCall, ProviderGuard,
                          RetryPolicy, UsageDetails, provider_guard, read_usage, read_usage_details,
                          record_provider_call, redact, redact_secret, redact_url, with_context)

SYSTEM_PROMPT = (
    "You document relational databases for analysts. Answer with one JSON object only, "
    "following the task's instructions."
)

TASKS = {
    "describe_columns": 'Describe each column in one sentence. Return {"columns": {"<column>": "<description>"}}.',
    "describe_entity": 'Name the business entity this table holds. Return {"name": "...", "description": "..."}.',
    "glossary": 'List business terms analysts use with these entities. Return {"terms": [{"term": "...", '
                '"definition": "...", "tables": ["..."]}]}.',
    "enrich_term": 'Define the term precisely and give one SQL query that computes it. Return {"definition": "...", '
                   '"sql": "..."}.',
}


class Enricher(Protocol):
    name: str

    def complete_json(self, task: str, payload: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]: ...


def _words(identifier: str) -> str:
    return re.sub(r"[_\s]+", " ", identifier).strip()


def singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def entity_name(table: str) -> str:
    """``order_items`` -> ``OrderItem``: the name derived from a table when no LLM answers."""
    parts = table.split("_")
    parts[-1] = singular(parts[-1])
    return "".join(p.capitalize() for p in parts if p)


def heuristic_answer(task: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Deterministic answers derived from names and profiles."""
    if task == "describe_columns":
        table = payload["table"]
        out = {}
        for col in payload["columns"]:
            name = col["name"]
            if col.get("primary_key"):
                text = f"Identifier of the {_words(singular(table))}."
            elif name.endswith("_id"):
                text = f"Reference to the {_words(name[:-3])} this {_words(singular(table))} belongs to."
            elif name.endswith(("_at", "_date")):
                text = f"When the {_words(singular(table))} was {_words(re.sub(r'_(at|date)$', '', name))}."
            else:
                text = f"The {_words(name)} of the {_words(singular(table))}."
            samples = col.get("samples") or []
            if samples:
                text += " Examples: " + ", ".join(str(s) for s in samples[:3]) + "."
            out[name] = text
        return {"columns": out}
    if task == "describe_entity":
        table = payload["table"]
        return {"name": entity_name(table),
                "description": f"A {_words(singular(table))} as recorded in the {table} table "
                               f"({len(payload.get('columns', []))} attributes)."}
    if task == "glossary":
        terms = []
        for entity in payload["entities"]:
            terms.append({"term": f"{_words(entity['name'])} count",
                          "definition": f"The number of distinct {_words(entity['table'])}.",
                          "tables": [entity["table"]]})
        return {"terms": terms}
    if task == "enrich_term":
        table = payload["tables"][0] if payload.get("tables") else None
        sql = f"SELECT COUNT(*) FROM {table}" if table else ""
        return {"definition": f"{payload['term']}: {payload.get('definition', '')}".strip(), "sql": sql}
    raise ValueError(f"unknown task {task!r}")


class HeuristicEnricher:
    name = "heuristic (offline, no LLM configured)"

    def complete_json(self, task: str, payload: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]:
        return heuristic_answer(task, payload)


class _RedactingFilter(logging.Filter):
    """The HTTP client logs each request's URL, userinfo included: masked before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, ()
        return True


_REDACTING_FILTER = _RedactingFilter()


def _redact_http_client_logs() -> None:
    for name in ("httpx", "httpx2", "openai"):
        logger = logging.getLogger(name)
        if _REDACTING_FILTER not in logger.filters:
            logger.addFilter(_REDACTING_FILTER)


class OpenAICompatibleEnricher:
    """Chat completions through the openai SDK; its own retries are off, ours (the shared policy) apply."""

    def __init__(self, base_url: str, model: str, api_key: str | None, timeout: float, policy: RetryPolicy,
                 guard: ProviderGuard | None = None, *, max_tokens: int | None = None,
                 prices: Prices | None = None) -> None:
        import openai

        self.base_url = base_url.rstrip("/")
        # what is stored, shown and keyed on (described_by, metadata, breakers, errors): no credentials
        self.endpoint = redact_url(self.base_url)
        self.model = model
        self.api_key = api_key or "not-needed"
        self.name = f"openai-compatible model={model} endpoint={self.endpoint}"
        self.policy = policy
        self.policy.context = {"model": model, "endpoint": self.endpoint}
        # Outside a recoverable node there is no pipeline to pause and no shared breaker: retries only.
        self.guard = guard or ProviderGuard(self.endpoint, policy=policy)
        self.max_tokens = max_tokens
        self.prices = prices or Prices.parse(None)
        _redact_http_client_logs()
        self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=timeout, max_retries=0)

    def _redact(self, text: str) -> str:
        return redact_secret(text, (self.api_key,))

    @staticmethod
    def messages(task: str, payload: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": json.dumps({"task": task, "instructions": TASKS[task], "input": payload},
                                                       default=str)}]

    def estimated_tokens(self, messages: list[dict[str, str]]) -> int:
        """An upper bound of what the call may spend: the prompt at 3 characters a token (tokenizers average
        about 4) plus a few per message, and the most the answer may hold (``max_tokens``)."""
        prompt = sum(len(m["content"]) // 3 + 8 for m in messages)
        return prompt + (self.max_tokens or 0)

    def _record(self, started: float, outcome: str, usage: tuple[int, int, str | None] = (0, 0, None),
                response_model: str | None = None, details: UsageDetails | None = None) -> None:
        """Every attempt, answered or not, goes into the ledger of the node (and item) it was made for.

        Named for OpenTelemetry as OpenAI's own instrumentation names it, whatever the base URL: a chat
        completion in OpenAI's format (a proxy or a local server speaking it is still ``openai``). A usage
        that could not be read has no cost (unknown) and a note."""
        tokens_in, tokens_out, note = usage  # read_usage's figures
        cost = None if note else self.prices.cost(self.model, tokens_in, tokens_out)
        record_provider_call(ProviderCall(
            endpoint=self.endpoint, model=self.model, tokens_in=tokens_in, tokens_out=tokens_out,
            latency_seconds=time.monotonic() - started, outcome=outcome, cost=cost, operation="chat",
            provider="openai", response_model=response_model, note=note, **(details or UsageDetails())._asdict()))

    def _call(self, task: str, payload: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=self.messages(task, payload),
                response_format={"type": "json_object"},
                temperature=0,
                **({"max_tokens": self.max_tokens} if self.max_tokens else {}),
            )
        except Exception as exc:  # noqa: BLE001 - every SDK error is classified with its context
            err = with_context(exc, model=self.model, endpoint=self.endpoint)
            self._record(started, err.category)
            raise ClassifiedError(category=err.category, status_code=err.status_code, retryable=err.retryable,
                                  model=self.model, endpoint=self.endpoint, retry_after=err.retry_after,
                                  message=self._redact(str(exc))) from None
        usage = getattr(response, "usage", None)
        answered_by = getattr(response, "model", None)
        self._record(started, "ok", read_usage(usage),
                     answered_by[:200] if isinstance(answered_by, str) and answered_by else None,
                     read_usage_details(usage))
        return self._parsed(response.choices[0].message.content or "")

    def _parsed(self, content: str) -> dict[str, Any]:
        try:
            answer = json.loads(content)
        except ValueError:
            raise ClassifiedError(category="validation", retryable=False, model=self.model, endpoint=self.endpoint,
                                  message=f"the model did not answer JSON: {self._redact(content[:200])}") from None
        if not isinstance(answer, dict):
            raise ClassifiedError(category="validation", retryable=False, model=self.model, endpoint=self.endpoint,
                                  message="the model answered JSON that is not an object")
        return answer

    def request_body(self, task: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The chat-completion request for ``task``, as a batch line's body."""
        return {
            "model": self.model,
            "messages": self.messages(task, payload),
            "response_format": {"type": "json_object"},
            "temperature": 0,
            **({"max_tokens": self.max_tokens} if self.max_tokens else {}),
        }

    def answer_of(self, body: dict[str, Any]) -> dict[str, Any]:
        """The JSON answer in a chat completion's body (a batch result line's)."""
        choices = body.get("choices") or [{}]
        return self._parsed(((choices[0] or {}).get("message") or {}).get("content") or "")

    def batch_jobs(self) -> Any:
        """This endpoint's Batch API as a provider job adapter (see ``run_provider_job``)."""
        from recovery_ext import OpenAIBatchJobs

        return OpenAIBatchJobs(self._client)

    def complete_json(self, task: str, payload: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]:
        """The model's JSON answer. Journaled in a node: a resume asking the same for an unfinished item gets the
        answer already paid for; ``fresh=True`` asks the model again."""
        messages = self.messages(task, payload)
        request = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens, "json": True}
        return self.guard.request(request, self._call, task, payload, estimated_tokens=self.estimated_tokens(messages),
                                  model=self.model, fresh=fresh)


class LLMResource(LibraryLLMResource):
    """The library's ``LLMResource`` (its SDK clients and settings) with the ontology job's enricher; leave
    ``base_url`` empty to run offline with the heuristic enricher."""

    batch: bool = Field(
        default=False, description="Column enrichment as one Batch API job (half the price, results within 24 h).")
    batch_poll_seconds: float = Field(default=30.0, description="Seconds between two looks at a pending batch.")

    @model_validator(mode="after")
    def _validate_batch_poll(self) -> LLMResource:
        """Refuse a poll interval that would hammer the provider (or NaN, which never waits) when the definitions
        load; the library's fields are checked by its own validator."""
        poll = self.batch_poll_seconds
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0.1 <= poll <= 86400:
            raise ConfigurationError(f"batch_poll_seconds must be a number of seconds from 0.1 to 86400, got {poll!r}")
        return self

    def enricher(self, node: NodeContext | None = None) -> Enricher:
        """The enricher for ``node``: its calls share the endpoint's breaker and pause the node's pipeline
        during outages (settings on the ``recovery`` resource). Without a node: in-call retries only."""
        if not self.base_url:
            return HeuristicEnricher()
        policy = self.policy()
        base = self.base_url.rstrip("/")
        prices = Prices.parse(self.prices)
        guard = provider_guard(node, redact_url(base), policy, limits=self.limits(), journal=self.journal,
                               prices=prices) if node is not None else None
        return OpenAICompatibleEnricher(base, self.model, self.api_key, self.timeout, policy, guard,
                                        max_tokens=self.max_tokens, prices=prices)
