"""The Anthropic SDK: error types in bodies and stream events, then its transport errors."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.families.llm_errors import judge_provider_error
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    return Family(
        facts=judge_provider_error(loaded_types("anthropic", "APIError")),
        structure=by_type([
            (loaded_types("anthropic", "APITimeoutError"), transient("timeout", "anthropic: timed out")),
            (loaded_types("anthropic", "RetryableError"),
             transient("unknown", "anthropic: RetryableError (opts into retries)")),
            (loaded_types("anthropic", "CredentialsError"), permanent("auth", "anthropic: no usable credentials")),
        ]),
        wrapper=by_type([(loaded_types("anthropic", "APIConnectionError"),
                          transient("connection", "anthropic: the request did not get through"))]),
    )
