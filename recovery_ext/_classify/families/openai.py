"""The OpenAI SDK: error types and codes in bodies and stream events, then its transport errors."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.families.llm_errors import judge_provider_error
from recovery_ext._classify.verdict import transient


def family() -> Family:
    return Family(
        facts=judge_provider_error(loaded_types("openai", "APIError")),
        structure=by_type([(loaded_types("openai", "APITimeoutError"), transient("timeout", "openai: timed out"))]),
        wrapper=by_type([(loaded_types("openai", "APIConnectionError"),
                          transient("connection", "openai: the request did not get through"))]),
    )
