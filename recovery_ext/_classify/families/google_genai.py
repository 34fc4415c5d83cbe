"""google-genai (Gemini): the error's canonical status (``UNAVAILABLE``, ``RESOURCE_EXHAUSTED`` ...)
read like a gRPC code, else its HTTP ``code``."""

from __future__ import annotations

from recovery_ext._classify.families import Family, loaded_types
from recovery_ext._classify.families.grpc import canonical_or_http
from recovery_ext._classify.verdict import Classification


def family() -> Family:
    errors = loaded_types("google.genai.errors", "APIError")

    def facts(exc: BaseException) -> Classification | None:
        if not errors or not isinstance(exc, errors):
            return None
        return canonical_or_http(exc, "status", "Gemini API")

    return Family(facts=facts)
