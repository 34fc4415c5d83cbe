"""A stand-in for the Gemini API's batch mode on 127.0.0.1 that counts the batches it created and the requests it
answered (the tests' provider, and the how-to's).

It speaks the wire API the ``google-genai`` SDK uses (Gemini Developer API, ``v1beta``): the resumable file
upload (``POST /upload/v1beta/files`` answers an ``x-goog-upload-url``; the content goes there with
``X-Goog-Upload-Command: upload, finalize``), ``POST /v1beta/models/{model}:batchGenerateContent`` over an
uploaded JSONL file (each line a ``key`` and its ``request``), ``GET /v1beta/batches/{id}`` and ``GET
/v1beta/batches`` (``pageSize``, ``pageToken``), each answering the batch as a long-running operation, and
``GET /v1beta/files/{id}`` and ``GET /v1beta/files/{id}:download?alt=media`` for its responses file. A batch is
``BATCH_STATE_RUNNING`` for ``duration`` seconds, then ``BATCH_STATE_SUCCEEDED``: each line answered with a
``GenerateContentResponse`` and its ``usageMetadata`` (a token per 4 characters), or, with ``fail_first=N``,
the first batch's lines after its first N failed one by one (``error``, code 13), as the service reports
them. Errors are ``{"error": {"code", "message", "status"}}``. Crash points: ``hold_create`` and
``drop_first_create``, as :class:`BatchServer` says; :meth:`forget` makes a batch unknown.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from recovery_pipelines.batch_stand_in import usage_of
from recovery_pipelines.stand_in_server import BatchServer, QuietHandler


@dataclass
class StandInGeminiBatch:
    id: str
    model: str
    display_name: str
    lines: list[dict]
    created: float
    state: str = "BATCH_STATE_RUNNING"
    responses_file: str | None = None
    answered: list[tuple[str, int, int]] = field(default_factory=list)  # key, tokens in, tokens out
    known: bool = True


def _unversioned(path: str):
    """The request's URL with its API version read as ``v1beta`` (the SDK asks ``v1`` under a custom base URL
    unless told otherwise; batch mode is the same API)."""
    return urlsplit(re.sub(r"^(/upload|/download)?/v1(beta)?/", lambda m: f"{m.group(1) or ''}/v1beta/", path))


def _text(request: dict) -> str:
    return " ".join(str(part.get("text", "")) for content in request.get("contents", [])
                    for part in content.get("parts", []))


class GeminiBatchProvider(BatchServer):
    def __init__(self, *, duration: float = 1.0, fail_first: int | None = None, hold_create: float = 0.0,
                 drop_first_create: float = 0.0) -> None:
        self.duration, self.fail_first = duration, fail_first
        super().__init__(hold_create, drop_first_create)
        self.files: dict[str, bytes] = {}
        self.sessions: dict[str, bool] = {}

    def forget(self, batch_id: str) -> None:
        with self.lock:
            self.batches[batch_id].known = False

    def _settle(self) -> None:
        for batch in self.batches.values():
            self._advance(batch)

    def _advance(self, batch: StandInGeminiBatch) -> None:
        if batch.state != "BATCH_STATE_RUNNING" or time.time() < batch.created + self.duration:
            return
        first = next(iter(self.batches)) == batch.id
        out = []
        for n, line in enumerate(batch.lines):
            if first and self.fail_first is not None and n >= self.fail_first:
                out.append({"key": line["key"], "error": {"code": 13, "message": "Internal error encountered.",
                                                          "status": "INTERNAL"}})
                continue
            prompt = _text(line["request"])
            text = f"a description of {prompt}"
            tokens_in, tokens_out = usage_of(prompt, text)
            batch.answered.append((line["key"], tokens_in, tokens_out))
            out.append({"key": line["key"], "response": {
                "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": tokens_in, "candidatesTokenCount": tokens_out,
                                  "totalTokenCount": tokens_in + tokens_out},
                "modelVersion": batch.model}})
        batch.responses_file = f"files/out-{uuid.uuid4().hex[:10]}"
        self.files[batch.responses_file] = "\n".join(json.dumps(o) for o in out).encode() + b"\n"
        batch.state = "BATCH_STATE_SUCCEEDED"

    def _operation(self, batch: StandInGeminiBatch) -> dict:
        self._advance(batch)
        stamp = dt.datetime.fromtimestamp(batch.created, dt.UTC).isoformat().replace("+00:00", "Z")
        metadata = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
                    "model": batch.model, "displayName": batch.display_name, "createTime": stamp,
                    "updateTime": stamp, "name": batch.id, "state": batch.state}
        if batch.responses_file:
            metadata["output"] = {"responsesFile": batch.responses_file}
        return {"name": batch.id, "metadata": metadata, "done": batch.state != "BATCH_STATE_RUNNING"}

    def handler(self) -> type[QuietHandler]:
        provider = self

        class Handler(QuietHandler):
            def do_POST(self):
                url = _unversioned(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if url.path == "/upload/v1beta/files":
                    session = uuid.uuid4().hex[:12]
                    with provider.lock:
                        provider.sessions[session] = True
                    return self._send_bytes(200, b"{}", "application/json",
                                            {"x-goog-upload-url": f"{provider.url}/upload-session/{session}",
                                             "x-goog-upload-status": "active"})
                if url.path.startswith("/upload-session/"):
                    name = f"files/in-{uuid.uuid4().hex[:10]}"
                    with provider.lock:
                        provider.files[name] = raw
                    return self._send_bytes(200, json.dumps({"file": {
                        "name": name, "mimeType": "application/jsonl", "sizeBytes": str(len(raw)),
                        "state": "ACTIVE", "uri": f"{provider.url}/v1beta/{name}"}}).encode(), "application/json",
                        {"x-goog-upload-status": "final"})
                create = re.fullmatch(r"/v1beta/models/([^:]+):batchGenerateContent", url.path)
                if not create:
                    return self._error(404, "NOT_FOUND", "not found")
                batch_body = json.loads(raw or b"{}").get("batch") or {}
                if not provider.creation_arrived():  # dropped: no batch exists
                    return self._error(503, "UNAVAILABLE", "The service is currently unavailable.")
                with provider.lock:
                    source = provider.files.get(str((batch_body.get("inputConfig") or {}).get("fileName")))
                    if source is None:
                        return self._error(400, "INVALID_ARGUMENT", "inputConfig.fileName: no such file")
                    batch = StandInGeminiBatch(f"batches/{uuid.uuid4().hex[:16]}", f"models/{create.group(1)}",
                                               str(batch_body.get("displayName") or ""),
                                               [json.loads(line) for line in source.splitlines() if line.strip()],
                                               time.time())
                    provider.batches[batch.id] = batch
                    created = provider._operation(batch)
                provider.created()
                self._json(200, created)

            def do_GET(self):
                url = _unversioned(self.path)
                download = re.fullmatch(r"(?:/download)?/v1beta/(files/[^:]+):download", url.path)
                with provider.lock:
                    if download:
                        data = provider.files.get(download.group(1))
                        if data is None:
                            return self._error(404, "NOT_FOUND", f"File {download.group(1)} not found.")
                        return self._send_bytes(200, data, "application/octet-stream")
                    stored = re.fullmatch(r"/v1beta/(files/[\w-]+)", url.path)
                    if stored and stored.group(1) in provider.files:
                        return self._json(200, {"name": stored.group(1), "mimeType": "application/jsonl",
                                                "sizeBytes": str(len(provider.files[stored.group(1)])),
                                                "state": "ACTIVE"})
                    one = re.fullmatch(r"/v1beta/(batches/[\w-]+)", url.path)
                    if one:
                        batch = provider.batches.get(one.group(1))
                        if batch is None or not batch.known:
                            return self._error(404, "NOT_FOUND", f"Batch {one.group(1)} not found.")
                        return self._json(200, provider._operation(batch))
                    if url.path == "/v1beta/batches":
                        query = parse_qs(url.query)
                        newest = [b for b in reversed(list(provider.batches.values())) if b.known]
                        start = int(query.get("pageToken", ["0"])[0] or 0)
                        size = int(query.get("pageSize", ["50"])[0])
                        page = newest[start:start + size]
                        answer = {"operations": [provider._operation(b) for b in page]}
                        if start + size < len(newest):
                            answer["nextPageToken"] = str(start + size)
                        return self._json(200, answer)
                self._error(404, "NOT_FOUND", "not found")

            def _error(self, status, kind, message):
                self._json(status, {"error": {"code": status, "message": message, "status": kind}})

            def _json(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), "application/json")

        return Handler
