"""JSON column values that decode without raising: a row that cannot be decoded is a value of its own."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
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


# The agreed form of a JSON value, the same on both databases (docs/how-to/journal.md, "What the databases keep").
# json.loads accepts what PostgreSQL's jsonb refuses and SQLite's text keeps: a NUL character, a lone UTF-16
# surrogate, NaN and the infinities. Each is stored as what JSON itself offers in its place: U+FFFD, the
# replacement character, for the first two (as every stored text column does with a NUL), and null for the
# numbers (as JavaScript's JSON.stringify writes them). A value is never refused for them: it was paid for.
REPLACEMENT = "\\ufffd"
# In ASCII JSON text, left to right: an escaped backslash (kept: a backslash then "u0000" is text, not a NUL),
# a surrogate pair (kept: a character beyond U+FFFF), then what is replaced: a NUL, or a surrogate left alone.
_ESCAPES = re.compile(r"\\\\|\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}|\\u0000|\\ud[89a-f][0-9a-f]{2}")
_checked = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _made_once() -> Callable[[Any], str]:
    """``_checked`` with CPython's C encoder made once per thread, not at every call as ``json`` makes it (for a
    small value, a third of its time: ctx.items(batch=N) encodes every item's result). Each thread's encoder has
    its own record of the containers it is inside, so a value that holds itself is refused by name, as by
    ``json``; an error can leave the containers it was inside in that record, so it is cleared then.
    Where the C encoder is missing (another interpreter) it is ``_checked``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _checked
    checked = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
    per_thread = threading.local()

    def encode(value: Any) -> str:
        try:
            encoder, markers = per_thread.made
        except AttributeError:
            markers = {}
            encoder = make(markers, checked.default, json.encoder.encode_basestring_ascii, None,
                           checked.key_separator, checked.item_separator, False, False, False)
            per_thread.made = (encoder, markers)
        try:
            return "".join(encoder(value, 0))
        except BaseException:
            markers.clear()
            raise

    return encode


_strict = _made_once()


def _agreed_escape(match: re.Match[str]) -> str:
    found = match.group()
    return found if found == "\\\\" or len(found) == 12 else REPLACEMENT


def storable_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as compact ASCII JSON text in the agreed form both databases store alike: NUL characters and lone
    surrogates as U+FFFD, NaN and the infinities as null. ``TypeError``/``ValueError`` when it is not JSON
    (``default`` converts what JSON does not know, as ``json.dumps`` does)."""
    encode = _strict if default is None else json.JSONEncoder(separators=(",", ":"), allow_nan=False,
                                                              default=default).encode
    try:
        text = encode(value)
    except ValueError:
        # NaN or an infinity (anything else not JSON raises again here): written as the tokens json.loads
        # reads, then read back with null in their place
        lenient = json.dumps(value, separators=(",", ":"), default=default)
        text = encode(json.loads(lenient, parse_constant=lambda _token: None))
    if "\\u0000" in text or "\\ud" in text:  # rare: found at C speed, replaced by one regex pass
        text = _ESCAPES.sub(_agreed_escape, text)
    return text


def agreed_json(value: Any) -> Any:
    """``value`` as a database gives it back after storing it (see :func:`storable_json`)."""
    return json.loads(storable_json(value))


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
