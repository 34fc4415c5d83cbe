"""A provider's ``usage`` as token counts the ledger can record, whatever the provider sent.

The answer is already paid for when its usage is read: a figure that cannot be a token count
(negative, not a whole number, NaN, beyond any real count) must not throw the answer away. It is
recorded as 0 with a note saying what the provider sent, and the call's cost is unknown.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, NamedTuple

from recovery_ext._classify.redaction import redact
from recovery_ext._store.models import MAX_TOKENS

_DIGITS = re.compile(r"[0-9]{1,19}")


_UNREADABLE = object()


class Usage(NamedTuple):
    tokens_in: int
    tokens_out: int
    note: str | None  # None when both figures were read as sent


def token_count(value: Any) -> int | None:
    """``value`` as a whole number of tokens; 0 when absent; None when it is not one."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):  # int, and numpy's integers
        whole = int(value)
        return whole if 0 <= whole < MAX_TOKENS else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() and 0 <= value < MAX_TOKENS else None
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
        return number if number < MAX_TOKENS else None
    return None


def read_usage(usage: Any, *, names: tuple[str, str] = ("prompt_tokens", "completion_tokens")) -> Usage:
    """The input and output tokens of ``usage`` (an object or a mapping; OpenAI's names by default)."""
    figures: list[int] = []
    odd: list[str] = []
    for name in names:
        try:
            raw = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        except Exception:  # noqa: BLE001 - a usage object whose attribute raises: that figure is unreadable
            raw = _UNREADABLE
        count = token_count(raw)
        if count is None:
            odd.append(f"{name}={redact(repr(raw))[:40]}")
        figures.append(count or 0)
    note = f"unreadable usage recorded as 0 tokens: {', '.join(odd)}" if odd else None
    return Usage(figures[0], figures[1], note)


class UsageDetails(NamedTuple):
    """Parts of a usage's input and output tokens (None: the provider did not say)."""

    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None


# Where each provider's usage names them: OpenAI (prompt_tokens_details.cached_tokens,
# completion_tokens_details.reasoning_tokens), Anthropic (cache_read_input_tokens,
# cache_creation_input_tokens) and Gemini (cached_content_token_count, thoughts_token_count).
_DETAIL_PATHS = {
    "cache_read_tokens": (("prompt_tokens_details", "cached_tokens"), ("input_tokens_details", "cached_tokens"),
                          ("cache_read_input_tokens",), ("cached_content_token_count",),
                          ("cachedContentTokenCount",)),
    "cache_write_tokens": (("cache_creation_input_tokens",),),
    "reasoning_tokens": (("completion_tokens_details", "reasoning_tokens"),
                         ("output_tokens_details", "reasoning_tokens"), ("thoughts_token_count",),
                         ("thoughtsTokenCount",)),
}


def _field(value: Any, name: str) -> Any:
    try:
        return value.get(name) if isinstance(value, dict) else getattr(value, name, None)
    except Exception:  # noqa: BLE001 - an attribute that raises: not said
        return None


def read_usage_details(usage: Any) -> UsageDetails:
    """The cached (read and written) and reasoning tokens ``usage`` reports, wherever its provider puts them;
    a figure that is absent or not a token count is None (never an error: the answer is already paid for)."""
    found: dict[str, int | None] = {}
    for key, paths in _DETAIL_PATHS.items():
        found[key] = None
        for path in paths:
            value = usage
            for name in path:
                value = _field(value, name) if value is not None else None
            if value is not None:
                count = token_count(value)
                found[key] = count
                break
    return UsageDetails(**found)
