"""A second labelled corpus: the libraries a pipeline calls besides the OpenAI SDK and PostgreSQL.

Every case drives a real library (botocore, grpcio, google-api-core, the Anthropic, OpenAI,
google-genai, Mistral and Cohere SDKs, LiteLLM, aiohttp, urllib3, websockets here; redis-py, PyMySQL,
asyncpg, smtplib, kombu, Celery in tests/support/classify_corpus_stores.py) against a server on
127.0.0.1 that the corpus starts (scripted HTTP, a real gRPC server, line-protocol and MySQL wire
fakes, websockets' own server) or against the local MariaDB, PostgreSQL, Redis and RabbitMQ, and
keeps the exception it raised. Each case says how it was produced; the few a library cannot raise
on its own (Dagster's RetryRequested as user code raises it) are marked ``constructed``.

The labels follow the project's policy: transient are connection loss, timeouts, 408/429/5xx,
throttling, overload, deadlocks, too many connections, locks; everything else is permanent; explicit
flags win; chains are transient if any link is.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from classify_corpus import NOT_HTTP, _answers, _closes_at_once, _free_port, _serve_raw, raised
from classify_corpus_servers import ScriptedHTTP, grpc_server

TRANSIENT, PERMANENT = True, False


@dataclass
class LibCase:
    name: str
    retryable: bool
    error: BaseException
    how: str
    constructed: bool = False


def case(name: str, retryable: bool, fn: Callable[[], object], how: str) -> LibCase:
    try:
        return LibCase(name, retryable, raised(fn), how)
    except AssertionError as exc:
        raise AssertionError(f"case {name}: {exc}") from None


# -- botocore --------------------------------------------------------------------------------------

def _aws(service: str, http: ScriptedHTTP | None, *, endpoint: str | None = None, read_timeout: float = 5):
    import botocore.session
    from botocore.config import Config

    return botocore.session.get_session().create_client(
        service, region_name="us-east-1", endpoint_url=endpoint or http.url, aws_access_key_id="AKIDCORPUS",
        aws_secret_access_key="corpus-secret",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=read_timeout,
                      s3={"addressing_style": "path"}))


S3_ERRORS = [(503, "SlowDown", TRANSIENT), (500, "InternalError", TRANSIENT), (503, "ServiceUnavailable", TRANSIENT),
             (400, "RequestTimeout", TRANSIENT), (403, "AccessDenied", PERMANENT), (404, "NoSuchKey", PERMANENT),
             (404, "NoSuchBucket", PERMANENT), (400, "InvalidArgument", PERMANENT),
             (405, "MethodNotAllowed", PERMANENT), (400, "ExpiredToken", PERMANENT),
             (403, "SignatureDoesNotMatch", PERMANENT), (412, "PreconditionFailed", PERMANENT),
             (416, "InvalidRange", PERMANENT)]
BEDROCK_ERRORS = [(429, "ThrottlingException", TRANSIENT), (503, "ServiceUnavailableException", TRANSIENT),
                  (500, "InternalServerException", TRANSIENT), (408, "ModelTimeoutException", TRANSIENT),
                  (429, "ModelNotReadyException", TRANSIENT), (400, "ServiceQuotaExceededException", TRANSIENT),
                  (400, "ValidationException", PERMANENT), (403, "AccessDeniedException", PERMANENT),
                  (404, "ResourceNotFoundException", PERMANENT), (424, "ModelErrorException", PERMANENT)]
DYNAMODB_ERRORS = [(400, "ProvisionedThroughputExceededException", TRANSIENT), (400, "ThrottlingException", TRANSIENT),
                   (400, "RequestLimitExceeded", TRANSIENT), (400, "TransactionConflictException", TRANSIENT),
                   (500, "InternalServerError", TRANSIENT), (400, "ConditionalCheckFailedException", PERMANENT),
                   (400, "ResourceNotFoundException", PERMANENT), (400, "ValidationException", PERMANENT),
                   (400, "UnrecognizedClientException", PERMANENT)]
TEXTRACT_ERRORS = [
    (400, "ProvisionedThroughputExceededException", TRANSIENT),
    (400, "LimitExceededException", TRANSIENT),
    (500, "InternalServerError", TRANSIENT),
    (400, "InvalidParameterException", PERMANENT),
    (400, "UnsupportedDocumentException", PERMANENT),
    (400, "BadDocumentException", PERMANENT),
]


def botocore_cases(http: ScriptedHTTP) -> list[LibCase]:
    cases: list[LibCase] = []
    s3, bedrock = _aws("s3", http), _aws("bedrock-runtime", http)
    dynamodb, textract = _aws("dynamodb", http), _aws("textract", http)
    for status, code, label in S3_ERRORS:
        body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>corpus {code}</Message></Error>"
        http.script(status, body, {"Content-Type": "application/xml"})
        cases.append(case(f"s3-{status}-{code}", label, lambda: s3.get_object(Bucket="docs", Key="page-1.pdf"),
                          f"botocore S3 GetObject; the local server answered {status} with an XML <Code>{code}</Code>"))
    for status, code, label in BEDROCK_ERRORS:
        http.script(status, json.dumps({"message": f"corpus {code}"}),
                    {"Content-Type": "application/json", "x-amzn-ErrorType": f"{code}:http://internal.amazon.com/"})
        cases.append(case(f"bedrock-{status}-{code}", label,
                          lambda: bedrock.invoke_model(modelId="anthropic.claude-v2", body=b"{}"),
                          f"botocore bedrock-runtime InvokeModel; {status} with x-amzn-ErrorType {code}"))
    for status, code, label in DYNAMODB_ERRORS:
        http.script(status, json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code}),
                    {"Content-Type": "application/x-amz-json-1.0"})
        cases.append(case(f"dynamodb-{status}-{code}", label,
                          lambda: dynamodb.get_item(TableName="ledger", Key={"id": {"S": "1"}}),
                          f"botocore DynamoDB GetItem; {status} with __type {code}"))
    for status, code, label in TEXTRACT_ERRORS:
        http.script(
            status, json.dumps({"__type": code, "Message": code}), {"Content-Type": "application/x-amz-json-1.1"}
        )
        cases.append(case(f"textract-{status}-{code}", label,
                          lambda: textract.detect_document_text(Document={"Bytes": b"%PDF"}),
                          f"botocore Textract DetectDocumentText; {status} with __type {code}"))
    refused = _aws("s3", None, endpoint=f"http://127.0.0.1:{_free_port()}")
    cases.append(case("s3-endpoint-refused", TRANSIENT, lambda: refused.list_buckets(),
                      "botocore S3 ListBuckets against a closed port: EndpointConnectionError"))
    http.script(200, "<ok/>", action="stall")
    slow = _aws("s3", http, read_timeout=0.3)
    cases.append(case("s3-read-timeout", TRANSIENT, lambda: slow.list_buckets(),
                      "botocore S3 ListBuckets, read_timeout 0.3 s, the server stalls 1.5 s: ReadTimeoutError"))
    http.script(action="close")
    cases.append(case("s3-connection-closed", TRANSIENT, lambda: s3.list_buckets(),
                      "botocore S3 ListBuckets, the server closes the connection without answering"))
    cases.append(case("s3-param-validation", PERMANENT, lambda: s3.get_object(Bucket="docs"),
                      "botocore S3 GetObject without its required Key: ParamValidationError"))
    return cases


# -- gRPC and google-api-core -------------------------------------------------------------------

GRPC_LABELS = {"UNAVAILABLE": TRANSIENT, "DEADLINE_EXCEEDED": TRANSIENT, "RESOURCE_EXHAUSTED": TRANSIENT,
               "ABORTED": TRANSIENT, "INTERNAL": TRANSIENT, "UNKNOWN": TRANSIENT, "DATA_LOSS": TRANSIENT,
               "CANCELLED": PERMANENT, "INVALID_ARGUMENT": PERMANENT, "FAILED_PRECONDITION": PERMANENT,
               "OUT_OF_RANGE": PERMANENT, "NOT_FOUND": PERMANENT, "ALREADY_EXISTS": PERMANENT,
               "PERMISSION_DENIED": PERMANENT, "UNAUTHENTICATED": PERMANENT, "UNIMPLEMENTED": PERMANENT}
GOOGLE_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "INVALID_ARGUMENT",
                "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED", "FAILED_PRECONDITION", "ALREADY_EXISTS")


def grpc_cases(port: int, http: ScriptedHTTP) -> list[LibCase]:
    import grpc
    import requests
    from google.api_core import exceptions as gexc
    from google.api_core import grpc_helpers, retry

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    def call(code):
        return channel.unary_unary(f"/corpus.Svc/{code}")
    cases = [case(f"grpc-{code}", label, lambda code=code: call(code)(b"", timeout=5),
                  f"grpcio unary call; the real gRPC server aborts with StatusCode.{code}")
             for code, label in GRPC_LABELS.items()]
    cases.append(case("grpc-servicer-crash", TRANSIENT, lambda: call("CRASH")(b"", timeout=5),
                      "grpcio unary call; the servicer raises, the server answers UNKNOWN"))
    cases.append(case("grpc-deadline", TRANSIENT, lambda: call("SLOW")(b"", timeout=0.3),
                      "grpcio unary call with a 0.3 s deadline; the servicer sleeps 2 s"))
    dead = grpc.insecure_channel(f"127.0.0.1:{_free_port()}")
    cases.append(case("grpc-refused", TRANSIENT, lambda: dead.unary_unary("/corpus.Svc/OK")(b"", timeout=2),
                      "grpcio unary call to a closed port: UNAVAILABLE"))
    for code in GOOGLE_CODES:
        wrapped = grpc_helpers.wrap_errors(call(code))
        cases.append(case(f"google-grpc-{code}", GRPC_LABELS[code], lambda wrapped=wrapped: wrapped(b"", timeout=5),
                          f"google.api_core.grpc_helpers.wrap_errors around a gRPC call aborted with {code}"))
    unavailable = grpc_helpers.wrap_errors(call("UNAVAILABLE"))
    retrying = retry.Retry(initial=0.01, maximum=0.02, timeout=0.3,
                           predicate=retry.if_exception_type(gexc.ServiceUnavailable))
    cases.append(case("google-retry-error", TRANSIENT, lambda: retrying(unavailable)(b"", timeout=5),
                      "google.api_core.retry.Retry (0.3 s budget) around an always-UNAVAILABLE call: RetryError"))
    for status, label in ((503, TRANSIENT), (429, TRANSIENT), (500, TRANSIENT), (404, PERMANENT), (400, PERMANENT),
                          (403, PERMANENT)):
        http.script(status, json.dumps({"error": {"code": status, "message": f"corpus {status}"}}),
                    {"Content-Type": "application/json"})
        cases.append(case(f"google-http-{status}", label,
                          lambda: _raise_google(gexc, requests.get(f"{http.url}/v1/projects/p/documents", timeout=5)),
                          f"requests GET answered {status}, turned into an exception by "
                          "google.api_core.exceptions.from_http_response (as the REST clients do)"))
    return cases


def _raise_google(gexc, response) -> None:
    raise gexc.from_http_response(response)


# -- Anthropic and OpenAI ---------------------------------------------------------------------------

ANTHROPIC_ERRORS = [(400, "invalid_request_error", PERMANENT), (401, "authentication_error", PERMANENT),
                    (403, "permission_error", PERMANENT), (404, "not_found_error", PERMANENT),
                    (413, "request_too_large", PERMANENT), (429, "rate_limit_error", TRANSIENT),
                    (500, "api_error", TRANSIENT), (503, "api_error", TRANSIENT),
                    (529, "overloaded_error", TRANSIENT), (504, "timeout_error", TRANSIENT)]


def _sse(*events: tuple[str, dict]) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def llm_cases(http: ScriptedHTTP) -> list[LibCase]:
    import anthropic
    import openai

    claude = anthropic.Anthropic(base_url=http.url, api_key="sk-ant-corpus", max_retries=0, timeout=5)

    def message(stream: bool = False):
        kwargs = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        if not stream:
            return claude.messages.create(**kwargs)
        with claude.messages.stream(**kwargs) as events:
            return list(events)

    cases: list[LibCase] = []
    for status, kind, label in ANTHROPIC_ERRORS:
        http.script(status, json.dumps({"type": "error", "error": {"type": kind, "message": f"corpus {kind}"}}),
                    {"Content-Type": "application/json"})
        cases.append(case(f"anthropic-{status}-{kind}", label, message,
                          f"anthropic messages.create; the local server answered {status} with error type {kind}"))
    start = ("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-x",
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}})
    for kind, label in (("overloaded_error", TRANSIENT), ("api_error", TRANSIENT), ("rate_limit_error", TRANSIENT),
                        ("invalid_request_error", PERMANENT)):
        http.script(200, _sse(start, ("error", {"type": "error", "error": {"type": kind, "message": "Overloaded"}})),
                    {"Content-Type": "text/event-stream"})
        cases.append(case(f"anthropic-stream-200-{kind}", label, lambda: message(stream=True),
                          f"anthropic messages.stream; HTTP 200, then an SSE error event of type {kind}"))
    refused = anthropic.Anthropic(base_url=f"http://127.0.0.1:{_free_port()}", api_key="sk-ant-corpus", max_retries=0)
    cases.append(case("anthropic-refused", TRANSIENT, lambda: refused.messages.create(
        model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]),
        "anthropic messages.create against a closed port: APIConnectionError"))
    http.script(200, "{}", action="stall")
    slow = anthropic.Anthropic(base_url=http.url, api_key="sk-ant-corpus", max_retries=0, timeout=0.3)
    cases.append(case("anthropic-timeout", TRANSIENT, lambda: slow.messages.create(
        model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]),
        "anthropic messages.create with a 0.3 s timeout; the server stalls: APITimeoutError"))

    gpt = openai.OpenAI(base_url=f"{http.url}/v1", api_key="sk-corpus", max_retries=0, timeout=5)

    def chat_stream():
        return list(gpt.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}],
                                                stream=True))

    for kind, label in (("server_error", TRANSIENT), ("rate_limit_exceeded", TRANSIENT),
                        ("invalid_request_error", PERMANENT)):
        http.script(200, f"data: {json.dumps({'error': {'message': 'corpus', 'type': kind, 'code': None}})}\n\n",
                    {"Content-Type": "text/event-stream"})
        cases.append(case(f"openai-stream-200-{kind}", label, chat_stream,
                          f"openai chat.completions stream; HTTP 200, then a data event with error type {kind}"))
    http.script(200, "data: " + json.dumps({"error": {"message": "The server had an error processing your request. "
                                                                  "Sorry about that!"}}) + "\n\n",
                {"Content-Type": "text/event-stream"})
    cases.append(case("openai-stream-200-untyped-server-error", TRANSIENT, chat_stream,
                      "openai chat.completions stream; HTTP 200, then an error event with only a message"))
    http.script(429, json.dumps({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                                           "code": "insufficient_quota"}}), {"Content-Type": "application/json"})
    cases.append(case("openai-429-insufficient-quota", PERMANENT, chat_stream,
                      "openai chat.completions; 429 whose error code is insufficient_quota (billing, not a throttle)"))
    return cases


GEMINI_ERRORS = [
    (503, "UNAVAILABLE", TRANSIENT),
    (429, "RESOURCE_EXHAUSTED", TRANSIENT),
    (500, "INTERNAL", TRANSIENT),
    (504, "DEADLINE_EXCEEDED", TRANSIENT),
    (400, "INVALID_ARGUMENT", PERMANENT),
    (403, "PERMISSION_DENIED", PERMANENT),
    (404, "NOT_FOUND", PERMANENT),
    (400, "FAILED_PRECONDITION", PERMANENT),
]


def gemini_mistral_cases(http: ScriptedHTTP) -> list[LibCase]:
    from google import genai
    from google.genai import types
    from mistralai.client import Mistral

    gemini = genai.Client(api_key="corpus-key", http_options=types.HttpOptions(base_url=http.url, timeout=5000))
    cases: list[LibCase] = []
    for status, name, label in GEMINI_ERRORS:
        http.script(status, json.dumps({"error": {"code": status, "message": f"corpus {name}", "status": name}}),
                    {"Content-Type": "application/json"})
        cases.append(case(f"gemini-{status}-{name}", label,
                          lambda: gemini.models.generate_content(model="gemini-x", contents="hi"),
                          f"google-genai models.generate_content; the server answered {status} with status {name}"))
    mistral = Mistral(api_key="corpus-key", server_url=http.url)
    for status, label in ((503, TRANSIENT), (429, TRANSIENT), (500, TRANSIENT), (400, PERMANENT), (401, PERMANENT),
                          (422, PERMANENT)):
        http.script(status, json.dumps({"message": f"corpus {status}", "object": "error", "type": "corpus"}),
                    {"Content-Type": "application/json"})
        cases.append(case(f"mistral-{status}", label,
                          lambda: mistral.chat.complete(model="m", messages=[{"role": "user", "content": "hi"}]),
                          f"mistralai chat.complete; the server answered {status}"))
    refused = Mistral(api_key="corpus-key", server_url=f"http://127.0.0.1:{_free_port()}")
    cases.append(case("mistral-refused", TRANSIENT,
                      lambda: refused.chat.complete(model="m", messages=[{"role": "user", "content": "hi"}]),
                      "mistralai chat.complete against a closed port"))
    return cases


# -- Cohere and LiteLLM: no family of their own; their errors carry the HTTP status (Cohere) or extend the
# OpenAI SDK's types and body (LiteLLM), which the classifier already reads --------------------------------

COHERE_STATUSES = [(429, TRANSIENT), (500, TRANSIENT), (503, TRANSIENT), (504, TRANSIENT), (400, PERMANENT),
                   (401, PERMANENT), (403, PERMANENT), (404, PERMANENT), (422, PERMANENT), (498, PERMANENT)]
LITELLM_OPENAI_ERRORS = [(429, "rate_limit_exceeded", TRANSIENT), (500, "server_error", TRANSIENT),
                         (503, None, TRANSIENT), (400, "invalid_request_error", PERMANENT),
                         (401, "invalid_api_key", PERMANENT), (404, None, PERMANENT),
                         (400, "context_length_exceeded", PERMANENT), (429, "insufficient_quota", PERMANENT)]
LITELLM_ANTHROPIC_ERRORS = [(529, "overloaded_error", TRANSIENT), (429, "rate_limit_error", TRANSIENT),
                            (500, "api_error", TRANSIENT), (400, "invalid_request_error", PERMANENT),
                            (401, "authentication_error", PERMANENT)]


def cohere_litellm_cases(http: ScriptedHTTP) -> list[LibCase]:
    import os

    import cohere

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # it would fetch its price list at import
    import litellm

    litellm.suppress_debug_info = True

    def chat(client=None):
        client = client or cohere.ClientV2(api_key="corpus-key", base_url=http.url, timeout=5)
        return lambda: client.chat(model="command-r", messages=[{"role": "user", "content": "hi"}],
                                   request_options={"max_retries": 0})

    cases: list[LibCase] = []
    for status, label in COHERE_STATUSES:
        http.script(status, json.dumps({"message": f"corpus {status}"}), {"Content-Type": "application/json"})
        cases.append(case(f"cohere-{status}", label, chat(), f"cohere ClientV2.chat; the server answered {status}"))
    cases.append(case("cohere-refused", TRANSIENT, chat(cohere.ClientV2(
        api_key="corpus-key", base_url=f"http://127.0.0.1:{_free_port()}", timeout=3)),
        "cohere ClientV2.chat against a closed port: httpx.ConnectError"))
    http.script(200, "{}", action="stall")
    cases.append(case("cohere-timeout", TRANSIENT, chat(cohere.ClientV2(api_key="corpus-key", base_url=http.url,
                                                                        timeout=0.3)),
                      "cohere ClientV2.chat with a 0.3 s timeout; the server stalls: httpx.ReadTimeout"))
    http.script(action="close")
    cases.append(case("cohere-connection-closed", TRANSIENT, chat(),
                      "cohere ClientV2.chat; the server closes without answering: httpx.RemoteProtocolError"))

    def completion(model: str = "openai/gpt-x", base: str | None = None, timeout: float = 5, stream: bool = False):
        def call():
            answer = litellm.completion(model=model, api_base=base or f"{http.url}/v1", api_key="sk-corpus",
                                        messages=[{"role": "user", "content": "hi"}], num_retries=0, max_retries=0,
                                        timeout=timeout, stream=stream)
            return list(answer) if stream else answer
        return call

    for status, code, label in LITELLM_OPENAI_ERRORS:
        error = {"message": "This model's maximum context length is 8192 tokens" if code == "context_length_exceeded"
                 else f"corpus {status}", "type": code, "code": code}
        http.script(status, json.dumps({"error": error}), {"Content-Type": "application/json"})
        cases.append(
            case(
                f"litellm-openai-{status}-{code or 'untyped'}",
                label,
                completion(),
                f"litellm.completion of an openai/ model; the server answered {status} with error code {code}",
            )
        )
    for status, kind, label in LITELLM_ANTHROPIC_ERRORS:
        http.script(status, json.dumps({"type": "error", "error": {"type": kind, "message": f"corpus {kind}"}}),
                    {"Content-Type": "application/json"})
        cases.append(case(f"litellm-anthropic-{status}-{kind}", label,
                          completion("anthropic/claude-x", base=http.url),
                          f"litellm.completion of an anthropic/ model; the server answered {status} with type {kind}"))
    cases.append(case("litellm-refused", TRANSIENT, completion(base=f"http://127.0.0.1:{_free_port()}/v1"),
                      "litellm.completion against a closed port (LiteLLM reports it as an InternalServerError)"))
    http.script(200, "{}", action="stall")
    cases.append(case("litellm-timeout", TRANSIENT, completion(timeout=0.3),
                      "litellm.completion with a 0.3 s timeout; the server stalls: litellm.Timeout"))
    http.script(200, "data: " + json.dumps({"error": {"message": "corpus", "type": "server_error"}}) + "\n\n",
                {"Content-Type": "text/event-stream"})
    cases.append(case("litellm-stream-200-server-error", TRANSIENT, completion(stream=True),
                      "litellm.completion(stream=True); HTTP 200, then a data event with error type server_error"))
    return cases


# -- aiohttp, urllib3, websockets ---------------------------------------------------------------

def aiohttp_cases(http: ScriptedHTTP) -> list[LibCase]:
    import aiohttp

    async def get(url: str, *, timeout: float = 5, check: bool = True, as_json: bool = False,
                  max_redirects: int = 10):
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                    session.get(url, max_redirects=max_redirects) as response):
            if check:
                response.raise_for_status()
            return await (response.json() if as_json else response.read())

    def run(**kw):
        return (lambda: asyncio.run(get(kw.pop("url", f"{http.url}/v1/x"), **kw)))
    cases: list[LibCase] = []
    for status, label in ((503, TRANSIENT), (429, TRANSIENT), (502, TRANSIENT), (404, PERMANENT), (401, PERMANENT),
                          (400, PERMANENT)):
        http.script(status, "{}")
        cases.append(
            case(f"aiohttp-{status}", label, run(), f"aiohttp GET + raise_for_status; the server said {status}")
        )
    http.script(action="close")
    cases.append(case("aiohttp-server-disconnected", TRANSIENT, run(),
                      "aiohttp GET; the server closes without answering: ServerDisconnectedError"))
    http.script(200, b"partial", action="short")
    cases.append(case("aiohttp-payload-cut", TRANSIENT, run(),
                      "aiohttp GET; Content-Length promises 100 more bytes than are sent: ClientPayloadError"))
    http.script(200, b"", action="stall")
    cases.append(
        case("aiohttp-timeout", TRANSIENT, run(timeout=0.3), "aiohttp GET, total timeout 0.3 s, the server stalls")
    )
    cases.append(case("aiohttp-refused", TRANSIENT, run(url=f"http://127.0.0.1:{_free_port()}/"),
                      "aiohttp GET to a closed port: ClientConnectorError"))
    cases.append(case("aiohttp-invalid-url", PERMANENT, run(url="http://:80:x/"), "aiohttp GET of a malformed URL"))
    http.script(302, headers={"Location": "/loop"})
    cases.append(case("aiohttp-redirect-loop", PERMANENT, run(max_redirects=3),
                      "aiohttp GET; the server redirects to itself forever: TooManyRedirects"))
    http.script(200, "<html>maintenance</html>", {"Content-Type": "text/html"})
    cases.append(case("aiohttp-content-type", PERMANENT, run(as_json=True),
                      "aiohttp response.json() on an HTML body: ContentTypeError"))
    return cases


def urllib3_cases(http: ScriptedHTTP) -> list[LibCase]:
    import urllib3

    pool = urllib3.PoolManager()
    def get(url=None, **kw):
        return (lambda: pool.request("GET", url or f"{http.url}/v1/x", **kw))
    cases = [case("urllib3-refused", TRANSIENT, get(f"http://127.0.0.1:{_free_port()}/", retries=urllib3.Retry(0)),
                  "urllib3 GET to a closed port, no retries: MaxRetryError(NewConnectionError)")]
    http.script(302, headers={"Location": "/loop"})
    cases.append(case("urllib3-redirect-loop", PERMANENT, get(retries=urllib3.Retry(redirect=2)),
                      "urllib3 GET, redirect=2; the server redirects to itself: MaxRetryError(too many redirects)"))
    for status, label in ((503, TRANSIENT), (429, TRANSIENT), (500, TRANSIENT), (404, PERMANENT)):
        http.script(status, "{}")
        cases.append(case(f"urllib3-status-forcelist-{status}", label,
                          get(retries=urllib3.Retry(total=1, status_forcelist=[status], backoff_factor=0)),
                          f"urllib3 GET with status_forcelist=[{status}]; the server keeps answering {status}"))
    http.script(200, b"", action="stall")
    cases.append(case("urllib3-read-timeout", TRANSIENT, get(timeout=0.3, retries=False),
                      "urllib3 GET, read timeout 0.3 s, the server stalls: ReadTimeoutError"))
    http.script(action="close")
    cases.append(case("urllib3-remote-disconnected", TRANSIENT, get(retries=False),
                      "urllib3 GET; the server closes without answering: ProtocolError"))
    http.script(200, b"\x1f\x8bnot gzip at all", {"Content-Encoding": "gzip"})
    cases.append(case("urllib3-decode-error", PERMANENT, get(retries=False),
                      "urllib3 GET; Content-Encoding gzip over a body that is not gzip: DecodeError"))
    http.script(200, b"partial", action="short")
    cases.append(
        case(
            "urllib3-incomplete-read",
            TRANSIENT,
            get(retries=False),
            "urllib3 GET; Content-Length promises 100 more bytes than are sent: ProtocolError(IncompleteRead)",
        )
    )
    cases.append(case("urllib3-no-host", PERMANENT, get("http:///nohost", retries=False),
                      "urllib3 GET of a URL without a host: LocationValueError"))
    return cases


def websockets_cases(http: ScriptedHTTP) -> list[LibCase]:
    from websockets.sync.client import connect
    from websockets.sync.server import serve

    def closes_with(code: int):
        def handler(ws) -> None:
            ws.recv()
            if code == 1006:
                ws.socket.shutdown(socket.SHUT_RDWR)
                return
            ws.close(code, "corpus")
        return handler

    def talk(url: str, **kwargs) -> None:
        with connect(url, open_timeout=3, **kwargs) as ws:
            ws.send("hello")
            ws.recv(timeout=3)
            ws.recv(timeout=3)

    cases: list[LibCase] = []
    for code, label in ((1011, TRANSIENT), (1012, TRANSIENT), (1013, TRANSIENT), (1001, TRANSIENT), (1006, TRANSIENT),
                        (1008, PERMANENT), (1003, PERMANENT), (1007, PERMANENT)):
        with serve(closes_with(code), "127.0.0.1", 0) as server:
            port = server.socket.getsockname()[1]
            import threading
            threading.Thread(target=server.serve_forever, daemon=True).start()
            cases.append(case(f"websockets-close-{code}", label, lambda port=port: talk(f"ws://127.0.0.1:{port}/"),
                              f"websockets sync client; websockets' own server closes with code {code}"))
            server.shutdown()

    def sends_big(ws) -> None:
        ws.recv()
        ws.send("x" * 4096)

    with serve(sends_big, "127.0.0.1", 0) as server:
        port = server.socket.getsockname()[1]
        import threading
        threading.Thread(target=server.serve_forever, daemon=True).start()
        cases.append(
            case(
                "websockets-message-too-big",
                PERMANENT,
                lambda: talk(f"ws://127.0.0.1:{port}/", max_size=1024),
                "websockets client with max_size=1024; the server sends 4 KiB: closed 1009",
            )
        )
        server.shutdown()
    for status, label in ((503, TRANSIENT), (429, TRANSIENT), (404, PERMANENT), (403, PERMANENT)):
        http.script(status, "no")
        cases.append(case(f"websockets-handshake-{status}", label, lambda: talk(f"ws://127.0.0.1:{http.port}/ws"),
                          f"websockets connect; the HTTP server refuses the upgrade with {status}: InvalidStatus"))
    with ExitStack() as stack:
        banner, banner_port = _serve_raw(_answers(NOT_HTTP))
        stack.callback(banner.close)
        cases.append(case("websockets-not-http-peer", PERMANENT, lambda: talk(f"ws://127.0.0.1:{banner_port}/"),
                          "websockets connect to an SSH banner: InvalidMessage"))
        closer, closer_port = _serve_raw(_closes_at_once)
        stack.callback(closer.close)
        cases.append(case("websockets-peer-hangs-up", TRANSIENT, lambda: talk(f"ws://127.0.0.1:{closer_port}/"),
                          "websockets connect; the peer accepts and closes at once (EOF during the handshake)"))
    cases.append(case("websockets-invalid-uri", PERMANENT, lambda: talk("http://127.0.0.1/"),
                      "websockets connect with an http:// URI: InvalidURI"))
    cases.append(case("websockets-refused", TRANSIENT, lambda: talk(f"ws://127.0.0.1:{_free_port()}/"),
                      "websockets connect to a closed port: ConnectionRefusedError"))
    return cases


def build_http_corpus() -> list[LibCase]:
    http = ScriptedHTTP()
    try:
        with grpc_server() as grpc_port:
            return (botocore_cases(http) + grpc_cases(grpc_port, http) + llm_cases(http)
                    + gemini_mistral_cases(http) + cohere_litellm_cases(http) + aiohttp_cases(http)
                    + urllib3_cases(http) + websockets_cases(http))
    finally:
        http.close()


def assert_test_only_dependencies(libraries: tuple[str, ...]) -> None:
    """Each library is in pyproject's ``dev`` extra and none is a dependency of ``pip install recovery-ext``."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    dev = " ".join(project["optional-dependencies"]["dev"]).lower()
    for library in libraries:
        assert library in dev and library not in core, library
