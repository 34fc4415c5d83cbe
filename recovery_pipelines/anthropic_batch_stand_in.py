"""A stand-in for Anthropic's Message Batches API on 127.0.0.1 that counts submissions and the requests it answered
(the tests' provider, and the how-to's).

It speaks the wire API the ``anthropic`` SDK uses: ``POST /v1/messages/batches`` (``requests``: each a
``custom_id`` and its ``params``), ``GET /v1/messages/batches/{id}``, ``GET /v1/messages/batches`` (newest
first, ``limit`` and ``after_id``; ``has_more``, ``first_id``, ``last_id``) and the batch's ``results_url``
(``GET /v1/messages/batches/{id}/results``, JSONL, once it ``ended``). A batch is ``in_progress`` for
``duration`` seconds, then ``ended``: each request answered with a message and its ``usage`` (a token per 4
characters), or, with ``expire_first=N``, the first batch's requests after its first N ``expired``, as the
service reports the ones it did not reach within 24 h (and bills none of them); ``rewrite_results(lines)``
rewrites the first batch's results file as served (a cut-off line, a duplicate). Errors are Anthropic's
``{"type": "error", "error": {"type": ..., "message": ...}}``.

Crash points: ``hold_create`` and ``drop_first_create``, as :class:`BatchServer` says.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from recovery_pipelines.batch_stand_in import usage_of
from recovery_pipelines.stand_in_server import BatchServer, QuietHandler

MODEL = "claude-stand-in"


@dataclass
class StandInMessageBatch:
    id: str
    requests: list[dict]
    created: float
    status: str = "in_progress"
    results: list[dict] = field(default_factory=list)
    answered: list[tuple[str, int, int]] = field(default_factory=list)  # custom_id, tokens in, tokens out


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def answer_text(params: dict) -> str:
    """What the stand-in answers to a request: its last message's text, described."""
    content = params["messages"][-1]["content"]
    text = content if isinstance(content, str) else " ".join(str(part.get("text", "")) for part in content)
    return f"a description of {text}"


class AnthropicBatchProvider(BatchServer):
    def __init__(self, *, duration: float = 1.0, expire_first: int | None = None, hold_create: float = 0.0,
                 drop_first_create: float = 0.0,
                 rewrite_results: Callable[[list[str]], list[str]] | None = None) -> None:
        self.duration, self.expire_first, self.rewrite_results = duration, expire_first, rewrite_results
        super().__init__(hold_create, drop_first_create)

    def _settle(self) -> None:
        for batch in self.batches.values():
            self._advance(batch)

    # -- the batch's life --------------------------------------------------------------------------

    def _advance(self, batch: StandInMessageBatch) -> None:
        if batch.status != "in_progress" or time.time() < batch.created + self.duration:
            return
        first = next(iter(self.batches)) == batch.id
        for n, request in enumerate(batch.requests):
            custom_id, params = request["custom_id"], request["params"]
            if first and self.expire_first is not None and n >= self.expire_first:
                batch.results.append({"custom_id": custom_id, "result": {"type": "expired"}})
                continue
            text = answer_text(params)
            tokens_in, tokens_out = usage_of(json.dumps(params["messages"]), text)
            batch.answered.append((custom_id, tokens_in, tokens_out))
            message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                       "model": params.get("model", MODEL), "content": [{"type": "text", "text": text}],
                       "stop_reason": "end_turn", "stop_sequence": None,
                       "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}}
            batch.results.append({"custom_id": custom_id, "result": {"type": "succeeded", "message": message}})
        batch.status = "ended"

    def _batch_json(self, batch: StandInMessageBatch) -> dict:
        self._advance(batch)
        ended = batch.status == "ended"
        kinds = [r["result"]["type"] for r in batch.results]
        counts = {"processing": 0 if ended else len(batch.requests), "succeeded": kinds.count("succeeded"),
                  "errored": kinds.count("errored"), "canceled": kinds.count("canceled"),
                  "expired": kinds.count("expired")}
        return {"id": batch.id, "type": "message_batch", "processing_status": batch.status,
                "request_counts": counts, "created_at": _when(batch.created),
                "ended_at": _when(batch.created + self.duration) if ended else None,
                "expires_at": _when(batch.created + 86400), "archived_at": None, "cancel_initiated_at": None,
                "results_url": f"{self.url}/v1/messages/batches/{batch.id}/results" if ended else None}

    # -- serving -----------------------------------------------------------------------------------

    def handler(self) -> type[QuietHandler]:
        provider = self

        class Handler(QuietHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if urlsplit(self.path).path != "/v1/messages/batches":
                    return self._error(404, "not_found_error", "Not found")
                body = json.loads(raw or b"{}")
                requests = body.get("requests")
                if not isinstance(requests, list) or not requests:
                    return self._error(400, "invalid_request_error", "requests: at least one request")
                if not provider.creation_arrived():  # dropped: no batch exists
                    return self._error(529, "overloaded_error", "Overloaded")
                with provider.lock:
                    batch = StandInMessageBatch(f"msgbatch_{uuid.uuid4().hex[:24]}", requests, time.time())
                    provider.batches[batch.id] = batch
                    created = provider._batch_json(batch)
                provider.created()
                self._send(200, created)

            def do_GET(self):
                url = urlsplit(self.path)
                one = re.fullmatch(r"/v1/messages/batches/([\w-]+)(/results)?", url.path)
                with provider.lock:
                    if one:
                        batch = provider.batches.get(one.group(1))
                        if batch is None:
                            return self._error(404, "not_found_error", f"No batch found with id {one.group(1)}")
                        shown = provider._batch_json(batch)
                        if not one.group(2):
                            return self._send(200, shown)
                        if batch.status != "ended":
                            return self._error(400, "invalid_request_error", "the batch has not ended")
                        lines = [json.dumps(r) for r in batch.results]
                        if provider.rewrite_results and next(iter(provider.batches)) == batch.id:
                            lines = provider.rewrite_results(lines)
                        data = "\n".join(lines).encode() + b"\n"
                        return self._send_bytes(200, data, "application/binary")
                    if url.path == "/v1/messages/batches":
                        query = parse_qs(url.query)
                        newest = sorted(provider.batches.values(), key=lambda b: b.created, reverse=True)
                        after = query.get("after_id", [None])[0]
                        if after in provider.batches:
                            newest = newest[[b.id for b in newest].index(after) + 1:]
                        limit = int(query.get("limit", ["20"])[0])
                        data = [provider._batch_json(b) for b in newest[:limit]]
                        return self._send(200, {"data": data, "has_more": len(newest) > limit,
                                                "first_id": data[0]["id"] if data else None,
                                                "last_id": data[-1]["id"] if data else None})
                self._error(404, "not_found_error", "Not found")

            def _error(self, status, kind, message):
                self._send(status, {"type": "error", "error": {"type": kind, "message": message}})

            def _send(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), "application/json",
                                 {"request-id": f"req_{uuid.uuid4().hex[:24]}"})

        return Handler
