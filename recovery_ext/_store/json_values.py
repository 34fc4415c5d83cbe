"""JSON column values that decode without raising: a row that cannot be decoded is a value of its own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CorruptJson:
    """A JSON column value that cannot be decoded: text that does not parse (SQLite), or a value
    nested too deeply for Python (either database). The row is bad; the rest of the result is not."""

    raw: str
    error: str


# Deeper values decode (or fail) only by recursion: one such row must not stop every query that reads it,
# nor break whatever re-encodes it later (run config, CLI output, event payloads).
MAX_JSON_DEPTH = 200


def load_json(data: str | bytes | bytearray | memoryview) -> Any:
    """Decode a JSON column; what cannot be decoded comes back as :class:`CorruptJson`, never raised.

    Also the PostgreSQL driver's json/jsonb loader (see ``PostgresDialect.engine_options``).
    """
    if isinstance(data, memoryview):
        data = bytes(data)
    try:
        value = json.loads(data)
    except RecursionError:
        return CorruptJson(raw=_preview(data), error=f"nested deeper than {MAX_JSON_DEPTH} levels")
    except (TypeError, ValueError) as exc:
        return CorruptJson(raw=_preview(data), error=str(exc))
    if isinstance(value, (dict, list)) and _openers(data) > MAX_JSON_DEPTH and _too_deep(value):
        return CorruptJson(raw=_preview(data), error=f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _preview(data: Any) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data)
    return text[:200]


def _openers(data: Any) -> int:
    """An upper bound of the nesting depth, at C speed: most values are refused as deep without a walk."""
    if isinstance(data, (bytes, bytearray)):
        return data.count(b"[") + data.count(b"{")
    return int(data.count("[") + data.count("{"))


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return True
        children = current.values() if isinstance(current, dict) else current
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
