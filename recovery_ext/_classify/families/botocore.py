"""botocore (boto3, S3, Bedrock, Textract ...): the service's error code, then the response's HTTP status.

Throttling answers often come as HTTP 400 (``ThrottlingException``), so the code decides first.
Event-stream errors (Bedrock's ``InvokeModelWithResponseStream``) spell codes with a lower-case
first letter (``throttlingException``) and carry no status: codes are compared case-insensitively.
"""

from __future__ import annotations

import sys

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, http_classification, permanent, transient

# Beyond the codes botocore's own retry checkers list (read from it below when present).
_THROTTLING = {
    "throttling", "throttlingexception", "throttledexception", "requestthrottledexception", "toomanyrequestsexception",
    "provisionedthroughputexceededexception", "requestlimitexceeded", "bandwidthlimitexceeded", "slowdown",
    "limitexceededexception", "ec2throttledexception", "requestthrottled", "servicequotaexceededexception",
    "transactioninprogressexception",
}
_SERVER = {
    "requesttimeout", "requesttimeoutexception", "priorrequestnotcomplete", "internalerror", "internalfailure",
    "internalservererror", "internalserverexception", "serviceunavailable", "serviceunavailableexception",
    "serviceexception", "internalserviceerror", "internalserviceexception", "modelnotreadyexception",
    "modeltimeoutexception", "modelstreamerrorexception", "transactionconflictexception", "serverexception",
}


def _codes_of_botocore() -> set[str]:
    standard = sys.modules.get("botocore.retries.standard")
    found: set[str] = set()
    for checker, attr in (("ThrottledRetryableChecker", "_THROTTLED_ERROR_CODES"),
                          ("TransientRetryableChecker", "_TRANSIENT_ERROR_CODES")):
        codes = getattr(getattr(standard, checker, None), attr, None)
        if isinstance(codes, (list, tuple)):
            found.update(str(code).lower() for code in codes)
    return found


def family() -> Family:
    client_errors = loaded_types("botocore.exceptions", "ClientError")
    retryable_codes = _THROTTLING | _SERVER | _codes_of_botocore()

    def facts(exc: BaseException) -> Classification | None:
        if not client_errors or not isinstance(exc, client_errors):
            return None
        response = getattr(exc, "response", None)
        response = response if isinstance(response, dict) else {}
        error = raw if isinstance(raw := response.get("Error"), dict) else {}
        code = str(error.get("Code") or "")
        meta = raw if isinstance(raw := response.get("ResponseMetadata"), dict) else {}
        status = meta.get("HTTPStatusCode")
        status = status if isinstance(status, int) and not isinstance(status, bool) else None
        lowered = code.lower()
        if lowered in retryable_codes or "throttl" in lowered:  # KMSThrottlingException, EC2ThrottledException ...
            category = "rate_limit" if lowered in _THROTTLING or "throttl" in lowered else "server_error"
            return Classification(True, category, status, f"AWS {code}")
        if status is not None and status >= 300:
            return http_classification(status, f"AWS {code or 'error'} (HTTP {status})")
        if code:
            return permanent("client_error", f"AWS {code}", status)
        return None

    module = "botocore.exceptions"
    return Family(
        facts=facts,
        structure=by_type([
            (loaded_types(module, "SSLError"), permanent("tls", "botocore: TLS failed")),
            (loaded_types(module, "ReadTimeoutError", "ConnectTimeoutError"),
             transient("timeout", "botocore: timed out")),
            (loaded_types(module, "ConnectionError", "HTTPClientError", "IncompleteReadError"),
             transient("connection", "botocore: the request did not get through")),
            (loaded_types(module, "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                          "NoAuthTokenError", "TokenRetrievalError"),
             permanent("auth", "botocore: no usable credentials")),
            (loaded_types(module, "ParamValidationError", "ValidationError", "NoRegionError", "UnknownServiceError",
                          "UnknownEndpointError", "InvalidConfigError"),
             permanent("configuration", "botocore: invalid parameters or configuration")),
        ]),
    )
