"""google-api-core (Vertex AI, Document AI, Cloud clients): the gRPC status of an error when it has
one (``Aborted`` is a conflict to retry, though its HTTP code is 409), else its HTTP ``code``.
A ``RetryError`` walks on to the last error it retried (``cause``)."""

from __future__ import annotations

from recovery_ext._classify.families import Family, loaded_types
from recovery_ext._classify.families.grpc import canonical_or_http
from recovery_ext._classify.verdict import Classification, transient


def family() -> Family:
    module = "google.api_core.exceptions"
    call_errors = loaded_types(module, "GoogleAPICallError")
    retry_errors = loaded_types(module, "RetryError")

    def facts(exc: BaseException) -> Classification | None:
        if not call_errors or not isinstance(exc, call_errors):
            return None
        return canonical_or_http(exc, "grpc_status_code", "Google API")

    def inner(exc: BaseException) -> BaseException | None:
        cause = getattr(exc, "cause", None) if retry_errors and isinstance(exc, retry_errors) else None
        return cause if isinstance(cause, BaseException) else None

    def wrapper(exc: BaseException) -> Classification | None:
        if retry_errors and isinstance(exc, retry_errors):
            return transient("timeout", "Google API retry deadline exceeded")
        return None

    return Family(facts=facts, wrapper=wrapper, inner=inner)
