"""Dagster's own exceptions: a ``RetryRequested`` asks for a retry; a ``Failure`` that forbids
retries is final. Looked up in ``sys.modules``: the classifier never imports Dagster."""

from __future__ import annotations

from recovery_ext._classify.families import Family, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient


def family() -> Family:
    requested, failure = loaded_types("dagster", "RetryRequested"), loaded_types("dagster", "Failure")

    def facts(exc: BaseException) -> Classification | None:
        if requested and isinstance(exc, requested):
            return transient("unknown", "Dagster RetryRequested")
        if failure and isinstance(exc, failure) and getattr(exc, "allow_retries", None) is False:
            return permanent("unknown", "Dagster Failure(allow_retries=False)")
        return None

    return Family(facts=facts)
