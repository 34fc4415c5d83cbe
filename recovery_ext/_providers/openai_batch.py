"""OpenAI's Batch API as a provider job (see :func:`run_provider_job`): half the price, results within 24 h.

A job is one JSONL file of requests (``custom_id`` = the item key) uploaded with purpose ``batch`` and one
batch over it, created with the job's idempotency token in its ``metadata`` so a resume whose crash came
before the batch id was recorded finds it by the token instead of creating another. Results come from
the batch's output file (answers, with usage) and error file (e.g. ``batch_expired``), also for an
expired or cancelled batch. The ``openai`` SDK does the wire work; its own retries stay on for these few
idempotent reads and the upload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from recovery_ext._classify.redaction import redact_url
from recovery_ext._providers.jobs import CANCELLED, COMPLETED, EXPIRED, FAILED, RUNNING, JobResult
from recovery_ext._providers.usage import read_usage

TOKEN_KEY = "recovery_token"
_STATES = {"validating": RUNNING, "in_progress": RUNNING, "finalizing": RUNNING, "completed": COMPLETED,
           "expired": EXPIRED, "cancelling": RUNNING, "cancelled": CANCELLED, "failed": FAILED}


class OpenAIBatchJobs:
    """Chat-completion requests (each a request body, as ``client.chat.completions.create`` takes it) as one
    batch per job, through ``client`` (an ``openai.OpenAI``)."""

    provider = "openai-batch"

    def __init__(self, client: Any, *, url: str = "/v1/chat/completions", completion_window: str = "24h") -> None:
        self.client, self.url, self.completion_window = client, url, completion_window
        self.endpoint = redact_url(f"{str(client.base_url).rstrip('/')}/batches")

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        lines = "\n".join(json.dumps({"custom_id": key, "method": "POST", "url": self.url, "body": body})
                          for key, body in requests.items())
        uploaded = self.client.files.create(file=("requests.jsonl", lines.encode()), purpose="batch")
        batch = self.client.batches.create(input_file_id=uploaded.id, endpoint=self.url,
                                           completion_window=self.completion_window, metadata={TOKEN_KEY: token})
        return batch.id

    def find(self, token: str) -> str | None:
        for batch in self.client.batches.list(limit=100):
            if (batch.metadata or {}).get(TOKEN_KEY) == token:
                return batch.id
        return None

    def status(self, job_id: str) -> str:
        return _STATES.get(self.client.batches.retrieve(job_id).status, RUNNING)

    def results(self, job_id: str) -> dict[str, JobResult]:
        batch = self.client.batches.retrieve(job_id)
        found: dict[str, JobResult] = {}
        for file_id in (batch.error_file_id, batch.output_file_id):  # an answer wins over an error
            if not file_id:
                continue
            for line in self.client.files.content(file_id).text.splitlines():
                if line.strip():
                    key, result = _result(json.loads(line))
                    found[key] = result
        return found


def _result(line: dict) -> tuple[str, JobResult]:
    key = str(line.get("custom_id"))
    response = line.get("response") or {}
    error = line.get("error")
    if error or response.get("status_code") != 200:
        code = (error or {}).get("code") or f"http_{response.get('status_code')}"
        return key, JobResult(error=str(code)[:64])
    body = response.get("body") or {}
    # The answer is paid for: a usage it cannot read is recorded as 0 tokens with a note, never an error.
    usage = read_usage(body.get("usage"))
    return key, JobResult(answer=body, tokens_in=usage.tokens_in, tokens_out=usage.tokens_out, note=usage.note,
                          model=body.get("model"))
