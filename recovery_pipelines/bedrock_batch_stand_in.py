"""A stand-in for Amazon Bedrock batch inference on 127.0.0.1, with the S3 it reads and writes, that counts the
jobs it created and the records it answered (the tests' provider, and the how-to's).

It speaks the wire APIs botocore uses: Bedrock's REST-JSON ``POST /model-invocation-job``
(``CreateModelInvocationJob``: as the service does, a creation repeated under the same
``clientRequestToken`` answers the same ``jobArn`` and creates nothing) and ``GET
/model-invocation-job/{jobIdentifier}`` (404 ``ResourceNotFoundException`` for a job it does not know), and
S3's path-style ``PUT`` and ``GET /{bucket}/{key}`` (a streamed, ``aws-chunked`` upload too), signed (SigV4;
any credentials do). A job is ``InProgress`` for ``duration`` seconds, then ``Completed``: each record of its
JSONL input (``recordId``, ``modelInput``: an Anthropic Messages body) answered in
``{output}/{job id}/{input file}.out`` with ``modelOutput`` and its ``usage`` (a token per 4 characters), or,
with ``fail_first=N``, the first job's records after its first N failed one by one (``error``, HTTP 500), as
the service reports them (``PartiallyCompleted``); :meth:`forget` makes a job unknown. Crash points:
``hold_create`` and ``drop_first_create``, as :class:`BatchServer` says.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from recovery_pipelines.anthropic_batch_stand_in import answer_text
from recovery_pipelines.batch_stand_in import usage_of
from recovery_pipelines.stand_in_server import BatchServer, QuietHandler

ARN = "arn:aws:bedrock:us-east-1:000000000000:model-invocation-job/"


@dataclass
class StandInInvocationJob:
    arn: str
    body: dict
    created: float
    status: str = "InProgress"
    answered: list[tuple[str, int, int]] = field(default_factory=list)  # recordId, tokens in, tokens out
    known: bool = True

    @property
    def short_id(self) -> str:
        return self.arn.rsplit("/", 1)[1]


def _s3(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    return parts.netloc, parts.path.lstrip("/")


def dechunk(data: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (``<hex size>[;chunk-signature=...]\\r\\n<data>\\r\\n`` ... ``0``, then
    trailers such as a checksum)."""
    out, rest = b"", data
    while rest:
        head, _, rest = rest.partition(b"\r\n")
        size = int(head.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


class BedrockBatchProvider(BatchServer):
    def __init__(self, *, duration: float = 1.0, fail_first: int | None = None, hold_create: float = 0.0,
                 drop_first_create: float = 0.0) -> None:
        self.duration, self.fail_first = duration, fail_first
        super().__init__(hold_create, drop_first_create)
        self.objects: dict[tuple[str, str], bytes] = {}
        self.by_token: dict[str, str] = {}

    def forget(self, arn: str) -> None:
        with self.lock:
            self.batches[arn].known = False

    def _settle(self) -> None:
        for job in self.batches.values():
            self._advance(job)

    # -- the job's life ------------------------------------------------------------------------------

    def _advance(self, job: StandInInvocationJob) -> None:
        if job.status != "InProgress" or time.time() < job.created + self.duration:
            return
        source = job.body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
        records = [json.loads(line) for line in self.objects.get(_s3(source), b"").splitlines() if line.strip()]
        first = next(iter(self.batches)) == job.arn
        out = []
        for n, record in enumerate(records):
            if first and self.fail_first is not None and n >= self.fail_first:
                out.append({**record, "error": {"errorCode": 500, "errorMessage": "Internal server error"}})
                continue
            body = record["modelInput"]
            text = answer_text(body)
            tokens_in, tokens_out = usage_of(json.dumps(body["messages"]), text)
            job.answered.append((record["recordId"], tokens_in, tokens_out))
            out.append({**record, "modelOutput": {
                "id": f"msg_bdrk_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
                "model": job.body["modelId"], "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}}})
        bucket, prefix = _s3(job.body["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        name = source.rsplit("/", 1)[1]
        self.objects[(bucket, f"{prefix.rstrip('/')}/{job.short_id}/{name}.out")] = \
            "\n".join(json.dumps(o) for o in out).encode() + b"\n"
        job.status = "PartiallyCompleted" if any("error" in o for o in out) else "Completed"

    def _job_json(self, job: StandInInvocationJob) -> dict:
        self._advance(job)
        body = job.body
        stamp = dt.datetime.fromtimestamp(job.created, dt.UTC).isoformat()
        return {"jobArn": job.arn, "jobName": body["jobName"], "modelId": body["modelId"],
                "clientRequestToken": body.get("clientRequestToken"), "roleArn": body["roleArn"],
                "status": job.status, "submitTime": stamp, "lastModifiedTime": stamp,
                "inputDataConfig": body["inputDataConfig"], "outputDataConfig": body["outputDataConfig"]}

    # -- serving -------------------------------------------------------------------------------------

    def handler(self) -> type[QuietHandler]:
        provider = self

        class Handler(QuietHandler):
            def _raw(self) -> bytes:
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if "aws-chunked" in self.headers.get("Content-Encoding", "") or self.headers.get(
                        "x-amz-content-sha256", "").startswith("STREAMING-"):
                    data = dechunk(data)
                return data

            def do_PUT(self):
                data = self._raw()
                bucket, _, key = urlsplit(self.path).path.lstrip("/").partition("/")
                with provider.lock:
                    provider.objects[(bucket, unquote(key))] = data
                self._send_bytes(200, b"", "application/xml", {"ETag": f'"{uuid.uuid4().hex}"'})

            def do_POST(self):
                body = json.loads(self._raw() or b"{}")
                if urlsplit(self.path).path != "/model-invocation-job":
                    return self._error(404, "UnknownOperationException", "unknown operation")
                if not provider.creation_arrived():  # dropped: no job exists
                    return self._error(503, "ServiceUnavailableException", "Service unavailable")
                with provider.lock:
                    token = body.get("clientRequestToken")
                    known = provider.by_token.get(token) if token else None
                    if known is not None:
                        return self._json(200, {"jobArn": known})
                    job = StandInInvocationJob(ARN + uuid.uuid4().hex[:12], body, time.time())
                    provider.batches[job.arn] = job
                    if token:
                        provider.by_token[token] = job.arn
                provider.created()
                self._json(200, {"jobArn": job.arn})

            def do_GET(self):
                path = urlsplit(self.path).path
                with provider.lock:
                    if path.startswith("/model-invocation-job/"):
                        job = provider.batches.get(unquote(path[len("/model-invocation-job/"):]))
                        if job is None or not job.known:
                            return self._error(404, "ResourceNotFoundException", "The specified job was not found.")
                        return self._json(200, provider._job_json(job))
                    bucket, _, key = path.lstrip("/").partition("/")
                    data = provider.objects.get((bucket, unquote(key)))
                if data is None:
                    return self._send_bytes(404, b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The "
                                                 b"specified key does not exist.</Message></Error>", "application/xml")
                self._send_bytes(200, data, "application/octet-stream")

            def _error(self, status, kind, message):
                self._send_bytes(status, json.dumps({"message": message}).encode(), "application/json",
                                 {"x-amzn-ErrorType": kind})

            def _json(self, status, payload):
                self._send_bytes(status, json.dumps(payload).encode(), "application/json",
                                 {"x-amzn-RequestId": str(uuid.uuid4())})

        return Handler
