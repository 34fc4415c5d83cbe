"""google-genai (Gemini): the error's canonical status (``UNAVAILABLE``, ``RESOURCE_EXHAUSTED`` ...)
read like a gRPC code, else its HTTP ``code``."""

from __future__ import annotations

from recovery_ext._classify.families import Family, loaded_types
from recovery_ext._classify.families.grpc import GRPC_CODES, grpc_code_name
from recovery_ext._classify.verdict import Classification, http_classification


def family() -> Family:
    errors = loaded_types("google.genai.errors", "APIError")

    def facts(exc: BaseException) -> Classification | None:
        if not errors or not isinstance(exc, errors):
            return None
        name = grpc_code_name(getattr(exc, "status", None))
        if name:
            return GRPC_CODES[name]
        code = getattr(exc, "code", None)
        if isinstance(code, int) and not isinstance(code, bool) and 300 <= code <= 599:
            return http_classification(code, f"Gemini API error (HTTP {code})")
        return None

    return Family(facts=facts)
