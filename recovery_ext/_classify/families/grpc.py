"""gRPC: the call's ``StatusCode`` decides (``grpc.RpcError.code()``).

Transient: the codes gRPC documents as retryable or that map to HTTP 5xx/429 (UNAVAILABLE,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNKNOWN, DATA_LOSS); the others say
something about the request itself.
"""

from __future__ import annotations

from recovery_ext._classify.families import Family, loaded_types
from recovery_ext._classify.verdict import Classification, http_classification, permanent, transient

GRPC_CODES: dict[str, Classification] = {
    "UNAVAILABLE": transient("connection", "gRPC UNAVAILABLE"),
    "DEADLINE_EXCEEDED": transient("timeout", "gRPC DEADLINE_EXCEEDED"),
    "RESOURCE_EXHAUSTED": transient("rate_limit", "gRPC RESOURCE_EXHAUSTED"),
    "ABORTED": transient("database_transient", "gRPC ABORTED (a concurrency conflict)"),
    "INTERNAL": transient("server_error", "gRPC INTERNAL"),
    "UNKNOWN": transient("server_error", "gRPC UNKNOWN (the server failed)"),
    "DATA_LOSS": transient("server_error", "gRPC DATA_LOSS"),
    "CANCELLED": permanent("client_error", "gRPC CANCELLED"),
    "INVALID_ARGUMENT": permanent("validation", "gRPC INVALID_ARGUMENT"),
    "FAILED_PRECONDITION": permanent("validation", "gRPC FAILED_PRECONDITION"),
    "OUT_OF_RANGE": permanent("validation", "gRPC OUT_OF_RANGE"),
    "NOT_FOUND": permanent("not_found", "gRPC NOT_FOUND"),
    "ALREADY_EXISTS": permanent("validation", "gRPC ALREADY_EXISTS"),
    "PERMISSION_DENIED": permanent("auth", "gRPC PERMISSION_DENIED"),
    "UNAUTHENTICATED": permanent("auth", "gRPC UNAUTHENTICATED"),
    "UNIMPLEMENTED": permanent("client_error", "gRPC UNIMPLEMENTED"),
}


def grpc_code_name(code: object) -> str | None:
    """``StatusCode.UNAVAILABLE`` (or its name) as ``"UNAVAILABLE"``."""
    name = getattr(code, "name", code)
    return name if isinstance(name, str) and name in GRPC_CODES else None


def canonical_or_http(exc: BaseException, status_attr: str, what: str) -> Classification | None:
    """Google's errors: a canonical gRPC status in ``status_attr`` decides, else an HTTP ``code``."""
    name = grpc_code_name(getattr(exc, status_attr, None))
    if name:
        return GRPC_CODES[name]
    code = getattr(exc, "code", None)
    if isinstance(code, int) and not isinstance(code, bool) and 300 <= code <= 599:
        return http_classification(code, f"{what} {type(exc).__name__} (HTTP {code})")
    return None


def family() -> Family:
    rpc_errors = loaded_types("grpc", "RpcError")

    def facts(exc: BaseException) -> Classification | None:
        if not rpc_errors or not isinstance(exc, rpc_errors):
            return None
        method = getattr(exc, "code", None)
        try:
            name = grpc_code_name(method() if callable(method) else None)
        except Exception:  # noqa: BLE001 - an RpcError without a finished call says nothing
            return None
        return GRPC_CODES[name] if name else None

    return Family(facts=facts)
