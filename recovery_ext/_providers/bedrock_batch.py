"""Amazon Bedrock batch inference as a provider job (see :func:`run_provider_job`): a model invocation job over a
JSONL file of records in S3, half the price of on-demand calls.

A job's records (``recordId``, ``modelInput``: the model's request body) are written to
``{input_uri}/{token}/records.jsonl``, then ``CreateModelInvocationJob`` starts the job under the job's
idempotency token as its ``clientRequestToken``. Bedrock answers a creation repeated under the same token
with the same ``jobArn`` and starts nothing, so a resume whose crash came before the ARN was recorded
submits again and gets the running job (``find`` has nothing to look up), as with Textract. Each
``recordId`` is 11 letters and digits hashed from the token, the item's key and its request, so the output
names each item without the provider keeping anything of ours.

Results are read line by line, within :class:`ReadLimits`, from ``{output_uri}/{job id}/records.jsonl.out``:
``modelOutput`` is the answer (its ``usage`` as Anthropic's or Amazon's models report it), ``error`` an item
error (``bedrock_{errorCode}``, with its message), a line that does not parse costs its own item. A job
Bedrock no longer knows (``ResourceNotFoundException``) is ``expired`` with every item ``job_gone``, and a
finished job with no output file leaves each item ``missing_result`` with the job's own message. botocore
(the ``aws`` extra) is imported only by :meth:`BedrockBatchJobs.connect`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from recovery_ext._classify.classifier import ClassifiedError
from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError
from recovery_ext._providers.journal import fingerprint
from recovery_ext._providers.jobs import (CANCELLED, COMPLETED, EXPIRED, FAILED, JOB_GONE, MISSING_RESULT, RUNNING,
                                          UNREADABLE_RESULT, Intents, JobResult, JobResults, ReadLimits,
                                          ResultUnbounded, json_line, lines_within, note,
                                          service_error_code)
from recovery_ext._providers.usage import read_usage

_STATES = {"Submitted": RUNNING, "Validating": RUNNING, "Scheduled": RUNNING, "InProgress": RUNNING,
           "Stopping": RUNNING, "Completed": COMPLETED, "PartiallyCompleted": COMPLETED, "Failed": FAILED,
           "Stopped": CANCELLED, "Expired": EXPIRED}
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_RECORDS = "records.jsonl"


def record_id(token: str, key: str, request: Any) -> str:
    """A record's ``recordId``: 11 letters and digits, the same for the same job, item and request."""
    number = int(hashlib.sha256(f"{token}\0{key}\0{fingerprint(request) or repr(request)}".encode()).hexdigest(), 16)
    out = ""
    for _ in range(11):
        number, digit = divmod(number, len(_ALPHABET))
        out += _ALPHABET[digit]
    return out


def _split(uri: str, what: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigurationError(f"BedrockBatchJobs({what}=...) must be an s3:// URI, got {uri!r}")
    return parts.netloc, parts.path.strip("/")


class BedrockBatchJobs:
    """Model requests (each the body ``InvokeModel`` takes for ``model_id``, e.g. an Anthropic Messages body) as
    one Bedrock model invocation job per job, through ``bedrock`` (a botocore or boto3 ``bedrock`` client)
    and ``s3`` (an ``s3`` client): records written under ``input_uri``, answers read from ``output_uri``
    (both ``s3://bucket/prefix``), the job run as ``role_arn``. ``job_options`` go to
    ``CreateModelInvocationJob`` as they are (``timeoutDurationInHours``, ``vpcConfig``, ``tags``)."""

    provider = "bedrock-batch"
    # A creation under a clientRequestToken already used answers the job Bedrock started for it and starts none.
    submit_reattaches = True

    def __init__(self, bedrock: Any, s3: Any, *, model_id: str, role_arn: str, input_uri: str, output_uri: str,
                 limits: ReadLimits | None = None, job_options: Mapping[str, Any] | None = None) -> None:
        self.bedrock, self.s3, self.model_id, self.role_arn = bedrock, s3, model_id, role_arn
        self.input = _split(input_uri, "input_uri")
        self.output = _split(output_uri, "output_uri")
        self.limits = limits or ReadLimits()
        self.job_options = dict(job_options or {})
        self.endpoint = redact_url(f"{str(bedrock.meta.endpoint_url).rstrip('/')}/model-invocation-job")
        self._intents = Intents(record_id)
        self._gone: dict[str, str] = {}

    @classmethod
    def connect(cls, *, region_name: str, endpoint_url: str | None = None, s3_endpoint_url: str | None = None,
                **options: Any) -> BedrockBatchJobs:
        """Clients through botocore (the ``aws`` extra) with its standard retry mode; credentials from
        botocore's own chain, never from here."""
        try:
            import botocore.session
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigurationError("BedrockBatchJobs.connect needs botocore: "
                                     "pip install 'recovery-ext[aws]'") from exc
        session = botocore.session.get_session()
        config = Config(retries={"mode": "standard"}, s3={"addressing_style": "path"})
        return cls(session.create_client("bedrock", region_name=region_name, endpoint_url=endpoint_url or None,
                                         config=config),
                   session.create_client("s3", region_name=region_name, endpoint_url=s3_endpoint_url or None,
                                         config=config), **options)

    # -- the JobAdapter protocol --------------------------------------------------------------------

    def expect(self, token: str, requests: Mapping[str, Any], since: dt.datetime | None = None) -> None:
        """The job's intent: its token and its requests (names each record of its output)."""
        self._intents.expect(token, requests, since)

    def submit(self, requests: Mapping[str, Any], token: str) -> str:
        self.expect(token, requests)
        bucket, prefix = self.input
        key = "/".join(p for p in (prefix, token, _RECORDS) if p)
        lines = "\n".join(json.dumps({"recordId": record_id(token, item, request), "modelInput": request})
                          for item, request in requests.items())
        self.s3.put_object(Bucket=bucket, Key=key, Body=lines.encode() + b"\n")
        out_bucket, out_prefix = self.output
        created = self.bedrock.create_model_invocation_job(
            jobName=f"rx-{token[:40]}", roleArn=self.role_arn, clientRequestToken=token, modelId=self.model_id,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{bucket}/{key}", "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{out_bucket}/{out_prefix}".rstrip("/") + "/"}},
            **self.job_options)
        return str(created["jobArn"])

    def find(self, token: str) -> str | None:
        """Nothing to look up: a creation under the same token is the look-up (Bedrock answers the job it
        started for it)."""
        return None

    def status(self, job_id: str) -> str:
        job = self._job(job_id)
        if job is None:
            return EXPIRED
        state = _STATES.get(str(job.get("status")))
        if state is None:
            raise ClassifiedError(category="provider_job", retryable=False, endpoint=self.endpoint,
                                  message=f"bedrock job {job_id} says status {job.get('status')!r}, which is none "
                                          f"of {sorted(_STATES)}")
        return state

    def results(self, job_id: str) -> JobResults:
        where = f"bedrock job {job_id}"
        job = self._job(job_id)
        if job is None:
            return JobResults(absent=JobResult(error=JOB_GONE, note=note(where, self._gone[job_id])))
        found = JobResults()
        bucket, prefix = _split(str(((job.get("outputDataConfig") or {}).get("s3OutputDataConfig") or {})
                                    .get("s3Uri") or ""), "output_uri")
        key = "/".join(p for p in (prefix, job_id.rsplit("/", 1)[-1], f"{_RECORDS}.out") if p)
        try:
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
        except Exception as exc:
            if service_error_code(exc) not in ("NoSuchKey", "404"):
                raise
            said = job.get("message") or f"no output at s3://{bucket}/{key}"
            return JobResults(absent=JobResult(error=MISSING_RESULT, note=note(where, said)))
        try:
            for line in lines_within(body.iter_lines(), self.limits.reading(where)):
                rid, result = _read_line(line, where)
                item = self._intents.keys.get(rid) if rid is not None else None
                if rid is not None and item is None:
                    continue  # a record of this job's other items (another call's), not this one's
                found.add(item, result, where)
        except ResultUnbounded as exc:  # what was read is kept; the rest of the items are redone
            found.absent = JobResult(error=exc.category, note=note(where, exc.message))
        finally:
            body.close()
        return found

    def _job(self, job_id: str) -> dict[str, Any] | None:
        if job_id in self._gone:
            return None
        try:
            return dict(self.bedrock.get_model_invocation_job(jobIdentifier=job_id))
        except Exception as exc:
            if service_error_code(exc) != "ResourceNotFoundException":
                raise
            self._gone[job_id] = str((getattr(exc, "response", {}).get("Error") or {}).get("Message") or exc)
            return None


def _read_line(text: str, where: str) -> tuple[str | None, JobResult]:
    line = json_line(text, where, "recordId")
    if isinstance(line, tuple):  # a cut-off line still names its item: that item is redone
        return line
    rid = line.get("recordId")
    if not isinstance(rid, str) or not rid:
        return None, JobResult(error=UNREADABLE_RESULT, note=note(where, f"a record with no recordId: {text[:200]}"))
    error = line.get("error")
    if error is not None:
        detail = error if isinstance(error, dict) else {"errorMessage": str(error)}
        code = f"bedrock_{detail.get('errorCode') or 'error'}"[:64]
        return rid, JobResult(error=code, note=note(where, detail.get("errorMessage") or code))
    output = line.get("modelOutput")
    if not isinstance(output, dict):
        return rid, JobResult(error=UNREADABLE_RESULT, note=note(where, f"record {rid} has no modelOutput"))
    usage = output.get("usage")
    names = ("inputTokens", "outputTokens") if isinstance(usage, dict) and "inputTokens" in usage else (
        "input_tokens", "output_tokens")
    read = read_usage(usage, names=names)
    model = output.get("model")
    return rid, JobResult(answer=output, tokens_in=read.tokens_in, tokens_out=read.tokens_out, note=read.note,
                          model=model if isinstance(model, str) and model else None)
