"""A stand-in for OpenAI's Batch API on 127.0.0.1 that counts submissions and the requests it answered (the
crash demo's provider, and the tests').

It speaks the wire API the ``openai`` SDK uses: ``POST /v1/files`` (multipart, purpose ``batch``, a JSONL
of requests with ``custom_id``), ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches``
(list, for a lookup by metadata) and ``GET /v1/files/{id}/content`` (the output and error JSONL). A batch
is ``in_progress`` for ``duration`` seconds, then ``completed``: each request line answered as the
heuristic enricher would, with ``usage`` (a token per 4 characters, as tests/support/stand_in_llm.py charges).

The first batch can end otherwise, with only its first N requests answered, as OpenAI reports it (and
charges only the answered ones): ``expire_first=N`` ends it ``expired``, the rest in its error file as
``batch_expired``; ``cancel_first=N`` ends it as one its owner cancelled (``cancelling`` for one more
retrieval, then ``cancelled``), the rest in its error file as ``batch_cancelled``; ``fail_first=N`` ends
it ``completed`` with the rest failed one by one (each an HTTP 500 ``server_error`` response in its error
file). ``hold_create=S`` holds the answer to a batch creation for up to S seconds after the batch exists,
so a test can kill the client between the provider's creating the job and the client's learning its id;
``hold_upload=S`` holds the answer to a file upload likewise (the client dies before any batch exists).

Faults of the provider's own: ``rewrite_output(lines)`` rewrites the first batch's output file (its answer
lines, as dicts, to the text lines the file holds: a cut-off line, ``[]``, a duplicate or unknown
``custom_id``); ``forget_first`` makes the first batch unknown once created (``404`` to its retrieval, as a
deleted batch or one past retention); ``endless_list`` answers every page of the batch list with
``has_more`` and the same cursor.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP

from recovery_pipelines.llm import heuristic_answer
from recovery_pipelines.stand_in_server import BatchServer, QuietHandler


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


# How the first batch ends when told to end early: its final status and each unanswered request's
# ``response`` and ``error``.
Ending = tuple[str, Callable[[], tuple[dict | None, dict | None]]]
_EXPIRED: Ending = ("expired", lambda: (None, {"code": "batch_expired",
                                       "message": "This request could not be executed before the completion window "
                                                  "expired."}))
_CANCELLED: Ending = ("cancelled", lambda: (None, {"code": "batch_cancelled",
                                           "message": "This request was not executed because the batch was "
                                                      "cancelled."}))
_FAILED: Ending = ("completed", lambda: ({"status_code": 500, "request_id": uuid.uuid4().hex,
                                  "body": {"error": {"message": "The server had an error while processing your "
                                                                "request.", "type": "server_error", "param": None,
                                                     "code": None}}}, None))


class BatchProvider(BatchServer):
    url_path = "/v1"

    def __init__(self, *, duration: float = 1.0, expire_first: int | None = None, cancel_first: int | None = None,
                 fail_first: int | None = None, hold_create: float = 0.0, hold_upload: float = 0.0,
                 rewrite_output: Callable[[list[dict]], list[str]] | None = None, forget_first: bool = False,
                 endless_list: bool = False) -> None:
        self.duration, self.hold_upload = duration, hold_upload
        self.rewrite_output, self.forget_first, self.endless_list = rewrite_output, forget_first, endless_list
        self.list_pages = 0
        told = ((expire_first, _EXPIRED), (cancel_first, _CANCELLED), (fail_first, _FAILED))
        early: list[tuple[int, Ending]] = [(n, ending) for n, ending in told if n is not None]
        if len(early) > 1:
            raise ValueError("the first batch ends one way: expire_first, cancel_first or fail_first")
        self.first_ends = early[0] if early else None
        super().__init__(hold_create)  # the base sets hold_create: set here, it would be reset to 0
        self.files: dict[str, bytes] = {}
        self.order: list[str] = []
        self.chat_calls = 0
        self.uploads = 0  # request files received

    # -- the batch's life --------------------------------------------------------------------------

    def _advance(self, batch: StandInBatch) -> None:
        if batch.status == "cancelling":  # OpenAI shows a cancelled batch cancelling for a while first
            batch.status = "cancelled"
            return
        if batch.status != "in_progress" or time.time() < batch.created + self.duration:
            return
        answered, (final, unanswered) = len(batch.lines), ("completed", None)
        if self.first_ends is not None and self.order and self.order[0] == batch.id:
            answered, (final, unanswered) = self.first_ends
        out, errors = [], []
        for n, line in enumerate(batch.lines):
            if n >= answered and unanswered is not None:
                response, error = unanswered()
                errors.append({"id": f"batch_req_{uuid.uuid4().hex[:8]}", "custom_id": line["custom_id"],
                               "response": response, "error": error})
                continue
            completion = self._completion(line["body"])
            usage = completion["usage"]
            batch.answered.append((line["custom_id"], usage["prompt_tokens"], usage["completion_tokens"]))
            out.append({"id": f"batch_req_{uuid.uuid4().hex[:8]}", "custom_id": line["custom_id"], "error": None,
                        "response": {"status_code": 200, "request_id": uuid.uuid4().hex, "body": completion}})
        first = bool(self.order) and self.order[0] == batch.id
        lines = self.rewrite_output(out) if first and self.rewrite_output else [json.dumps(o) for o in out]
        batch.output_file_id = self._file("\n".join(lines).encode()) if lines else None
        batch.error_file_id = self._file("\n".join(json.dumps(e) for e in errors).encode()) if errors else None
        batch.status = "cancelling" if final == "cancelled" else final

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

    def _forgotten(self, batch_id: str) -> bool:
        return self.forget_first and bool(self.order) and self.order[0] == batch_id

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
                        provider.uploads += 1
                    if provider.hold_upload:
                        provider.released.wait(provider.hold_upload)
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
                        created = provider._batch_json(batch)
                    if provider.hold_create:  # the job exists; its id reaches the client later (or never)
                        provider.released.wait(provider.hold_create)
                    return self._send(200, created)
                self._send(404, {"error": {"message": "not found"}})

            def do_GET(self):
                content = re.fullmatch(r"/v1/files/([\w-]+)/content", self.path)
                one = re.fullmatch(r"/v1/batches/([\w-]+)", self.path)
                with provider.lock:
                    if content:
                        return self._send_bytes(200, provider.files[content.group(1)])
                    if one:
                        if one.group(1) not in provider.batches or provider._forgotten(one.group(1)):
                            return self._send(404, {"error": {"message": f"No batch found with id "
                                                                         f"'{one.group(1)}'.", "type":
                                                              "invalid_request_error", "code": None}})
                        batch = provider.batches[one.group(1)]
                        provider._advance(batch)
                        return self._send(200, provider._batch_json(batch))
                    if self.path.startswith("/v1/batches"):
                        provider.list_pages += 1
                        known = [b for b in provider.batches.values() if not provider._forgotten(b.id)]
                        for batch in known:
                            provider._advance(batch)
                        data = [provider._batch_json(b) for b in reversed(known)]
                        return self._send(200, {"object": "list", "data": data, "has_more": provider.endless_list,
                                                "first_id": data[0]["id"] if data else None,
                                                "last_id": data[-1]["id"] if data else None})
                self._send(404, {"error": {"message": "not found"}})

            def _send(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), "application/json")

        return Handler
