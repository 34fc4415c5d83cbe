"""What a whole answer of each API holds, so that a 2xx answer that is not one is never kept.

A proxy or a failing provider may answer 200 with the provider's error (``{"error": {...}}``) or with a body that
lacks the answer's own part (no ``choices``). The SDK then hands the caller an object whose fields are ``None`` and
the caller fails on it (a ``TypeError``, permanent), or the SDK shows no error at all; kept, that body would be
replayed to every retry and re-execution. Each API is one :class:`AnswerShape` subclass, registered by being
defined: the end of its request path and the list every whole answer of it holds. An API not listed is not judged.
"""

from __future__ import annotations

from typing import Any, ClassVar


class AnswerShape:
    """One API's answer: requests whose path ends with ``path_end`` are answered by an object holding the list
    ``holds``."""

    registered: ClassVar[list[type[AnswerShape]]] = []
    name: ClassVar[str]
    path_end: ClassVar[str]
    holds: ClassVar[str]
    never_empty: ClassVar[bool] = False  # a whole answer holds at least one

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        AnswerShape.registered.append(cls)

    @classmethod
    def failure(cls, value: dict[str, Any]) -> str | None:
        """Why an answer in this API's shape still is the provider's error, not its answer; None: it is not."""
        return None


class ChatCompletion(AnswerShape):
    """OpenAI's chat completions, and the servers compatible with it."""

    name, path_end, holds = "chat completion", "/chat/completions", "choices"
    never_empty = True  # n >= 1: one choice at least (a filtered one says so in its finish_reason)


class AnthropicMessage(AnswerShape):
    """Anthropic's messages (a refusal or an empty answer still holds an empty ``content`` list)."""

    name, path_end, holds = "message", "/messages", "content"


class OpenAIResponse(AnswerShape):
    """OpenAI's responses. An incomplete one is a whole answer (cut at ``max_output_tokens`` or by a filter: the
    SDK reads its reason), and so is one that failed for its request (an image it cannot read: asked again, it
    fails the same). One that failed for the provider's own trouble (:func:`failed_for_a_while`) is not: kept,
    every re-execution would replay that failure."""

    name, path_end, holds = "response", "/responses", "output"

    @classmethod
    def failure(cls, value: dict[str, Any]) -> str | None:
        if failed_for_a_while(value):
            return f"a response failed for the provider's trouble: {str(value.get('error'))[:80]}"
        return None


# The error codes of a failed OpenAI response that say the provider failed, not the request: another try may
# succeed. The others (invalid_prompt, the image errors...) fail the same each time.
PROVIDER_TROUBLE = frozenset({"server_error", "rate_limit_exceeded", "vector_store_timeout"})
# OpenAI's statuses of a response: whether it failed (its vocabulary, not the store's statuses)
_RESPONSE_FAILED = {"completed": False, "incomplete": False, "in_progress": False, "queued": False,
                    "cancelled": False, "failed": True}


def failed_for_a_while(response: Any) -> bool:
    """An OpenAI response (a POST's answer, or a stream's ``response.failed`` event's ``response``) that failed
    for the provider's own trouble, or with no code that says otherwise."""
    if not isinstance(response, dict) or not _RESPONSE_FAILED.get(str(response.get("status")), False):
        return False
    error = response.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code is None or code in PROVIDER_TROUBLE


class Embeddings(AnswerShape):
    """OpenAI's embeddings, and the servers compatible with it (``/v1/embeddings``; Ollama's own
    ``/api/embeddings`` answers another shape)."""

    name, path_end, holds = "embeddings", "/v1/embeddings", "data"


def shape_problem(path: str, value: Any) -> str | None:
    """Why ``value``, the JSON of a 2xx answer to a POST to ``path``, is not a whole answer of its API; None: it
    is, or the API is not known. (Only a POST calls an API: a GET to the same path lists what was stored, as
    ``{"object": "list", "data": [...]}``.)"""
    path = path.rstrip("/")
    for shape in AnswerShape.registered:
        if path.endswith(shape.path_end):
            held = value.get(shape.holds) if isinstance(value, dict) else None
            if isinstance(value, dict) and value.get("object") == "list":
                return None
            if isinstance(held, list) and (held or not shape.never_empty):
                assert isinstance(value, dict)
                return shape.failure(value)
            error = value.get("error") if isinstance(value, dict) else None
            if error:
                return f"the provider's error, not a {shape.name}: {str(error)[:80]}"
            return f"a {shape.name} with an empty {shape.holds} list" if isinstance(held, list) else \
                f"a {shape.name} without its {shape.holds} list"
    return None
