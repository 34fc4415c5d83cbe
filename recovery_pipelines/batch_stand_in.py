"""A stand-in for OpenAI's Batch API on 127.0.0.1 that counts submissions and the requests it answered (the
crash demo's provider, and the tests').

It speaks the wire API the ``openai`` SDK uses: ``POST /v1/files`` (multipart, purpose ``batch``, a JSONL
of requests with ``custom_id``), ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches``
(list, for a lookup by metadata) and ``GET /v1/files/{id}/content`` (the output and error JSONL). A batch
is ``in_progress`` for ``duration`` seconds, then ``completed``: each request line answered as the
heuristic enricher would, with ``usage`` (a token per 4 characters, as tests/support/stand_in_llm.py charges). ``expire_first=N``: the first batch instead
ends ``expired`` with only its first N requests answered; the rest are in its error file as
``batch_expired``, as OpenAI reports them (and does not charge).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP

from recovery_pipelines.llm import heuristic_answer
from recovery_pipelines.stand_in_server import LocalServer, QuietHandler


def usage_of(prompt_text: str, answer_text: str) -> tuple[int, int]:
    """What the stand-in charges: a token per 4 characters (as tests/support/stand_in_llm.py does)."""
    return len(prompt_text) // 4 + 1, len(answer_text) // 4 + 1


@dataclass
class StandInBatch:
    id: str
    input_file_id: str
    endpoint: str
    metadata: dict
    created: float
    lines: list[dict]
    status: str = "in_progress"
    output_file_id: str | None = None
    error_file_id: str | None = None
    answered: list[tuple[str, int, int]] = field(default_factory=list)  # custom_id, tokens in, tokens out


class BatchProvider(LocalServer):
    url_path = "/v1"

    def __init__(self, *, duration: float = 1.0, expire_first: int | None = None) -> None:
        self.duration, self.expire_first = duration, expire_first
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, StandInBatch] = {}
        self.order: list[str] = []
        self.chat_calls = 0
        self.lock = threading.Lock()

    # -- what it counted ---------------------------------------------------------------------------

    @property
    def submissions(self) -> int:
        with self.lock:
            return len(self.batches)

    def answered(self) -> list[tuple[str, int, int]]:
        with self.lock:
            return [a for b in self.batches.values() for a in b.answered]

    # -- the batch's life --------------------------------------------------------------------------

    def _advance(self, batch: StandInBatch) -> None:
        if batch.status != "in_progress" or time.time() < batch.created + self.duration:
            return
        expire = self.expire_first is not None and self.order and self.order[0] == batch.id
        out, errors = [], []
        for n, line in enumerate(batch.lines):
            if expire and n >= self.expire_first:
                errors.append({"id": f"batch_req_{uuid.uuid4().hex[:8]}", "custom_id": line["custom_id"],
                               "response": None,
                               "error": {"code": "batch_expired",
                                         "message": "This request could not be executed before the completion "
                                                    "window expired."}})
                continue
            completion = self._completion(line["body"])
            usage = completion["usage"]
            batch.answered.append((line["custom_id"], usage["prompt_tokens"], usage["completion_tokens"]))
            out.append({"id": f"batch_req_{uuid.uuid4().hex[:8]}", "custom_id": line["custom_id"], "error": None,
                        "response": {"status_code": 200, "request_id": uuid.uuid4().hex, "body": completion}})
        batch.output_file_id = self._file("\n".join(json.dumps(o) for o in out).encode()) if out else None
        batch.error_file_id = self._file("\n".join(json.dumps(e) for e in errors).encode()) if errors else None
        batch.status = "expired" if expire else "completed"

    @staticmethod
    def _completion(body: dict) -> dict:
        """The chat completion the heuristic enricher answers to ``body``, with its usage."""
        prompt_text = body["messages"][-1]["content"]
        prompt = json.loads(prompt_text)
        answer = json.dumps(heuristic_answer(prompt["task"], prompt["input"]))
        tokens_in, tokens_out = usage_of(prompt_text, answer)
        return {"id": "c", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                          "total_tokens": tokens_in + tokens_out}}

    def _file(self, data: bytes) -> str:
        file_id = f"file-{uuid.uuid4().hex[:12]}"
        self.files[file_id] = data
        return file_id

    def _batch_json(self, batch: StandInBatch) -> dict:
        total = len(batch.lines)
        done = len(batch.answered)
        return {"id": batch.id, "object": "batch", "endpoint": batch.endpoint, "input_file_id": batch.input_file_id,
                "completion_window": "24h", "status": batch.status, "created_at": int(batch.created),
                "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
                "metadata": batch.metadata,
                "request_counts": {"total": total, "completed": done,
                                   "failed": total - done if batch.status != "in_progress" else 0}}

    # -- serving -----------------------------------------------------------------------------------

    def start(self) -> str:
        return self.start_server()

    def handler(self) -> type[QuietHandler]:
        provider = self

        class Handler(QuietHandler):
            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def do_POST(self):
                raw = self._body()
                if self.path.startswith("/v1/files"):
                    message = BytesParser(policy=HTTP).parsebytes(
                        f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + raw)
                    parts = {p.get_param("name", header="content-disposition"): p for p in message.iter_parts()}
                    data = parts["file"].get_payload(decode=True)
                    with provider.lock:
                        file_id = provider._file(data)
                    return self._send(200, {"id": file_id, "object": "file", "bytes": len(data),
                                            "created_at": int(time.time()), "filename": "batch.jsonl",
                                            "purpose": "batch", "status": "processed"})
                if self.path.startswith("/v1/chat/completions"):  # the pipeline's other, synchronous calls
                    body = json.loads(raw)
                    with provider.lock:
                        provider.chat_calls += 1
                    return self._send(200, provider._completion(body))
                if self.path.startswith("/v1/batches"):
                    body = json.loads(raw)
                    with provider.lock:
                        lines = [json.loads(line) for line in provider.files[body["input_file_id"]].splitlines()
                                 if line.strip()]
                        batch = StandInBatch(f"batch_{uuid.uuid4().hex[:12]}", body["input_file_id"],
                                             body["endpoint"], body.get("metadata") or {}, time.time(), lines)
                        provider.batches[batch.id] = batch
                        provider.order.append(batch.id)
                        return self._send(200, provider._batch_json(batch))
                self._send(404, {"error": {"message": "not found"}})

            def do_GET(self):
                content = re.fullmatch(r"/v1/files/([\w-]+)/content", self.path)
                one = re.fullmatch(r"/v1/batches/([\w-]+)", self.path)
                with provider.lock:
                    if content:
                        return self._send_bytes(200, provider.files[content.group(1)])
                    if one:
                        batch = provider.batches[one.group(1)]
                        provider._advance(batch)
                        return self._send(200, provider._batch_json(batch))
                    if self.path.startswith("/v1/batches"):
                        for batch in provider.batches.values():
                            provider._advance(batch)
                        data = [provider._batch_json(b) for b in reversed(list(provider.batches.values()))]
                        return self._send(200, {"object": "list", "data": data, "has_more": False,
                                                "first_id": data[0]["id"] if data else None,
                                                "last_id": data[-1]["id"] if data else None})
                self._send(404, {"error": {"message": "not found"}})

            def _send(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), "application/json")

        return Handler
