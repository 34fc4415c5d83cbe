"""The formats the library writes and reads in more than one place, each spelled once.

- the placeholder owner ``resume-<pipeline>-<n>`` a reclaim writes until its resume run attaches (also built in
  SQL, from :data:`PLACEHOLDER_PREFIX`, by the bulk reclaim);
- the resume run's Dagster run key ``recovery-<pipeline>-<n>``, which makes a re-requested resume idempotent;
- the messages a superseded run is failed with;
- JSON, in its two forms: lenient, for rendering to humans (:func:`jsonable`), and exact, what the JSON columns
  store and a replay returns (:func:`storable_json`, :func:`agreed_json`); and JSON column values that decode
  without raising (:func:`load_json`): a row that cannot be decoded is a value of its own (:class:`CorruptJson`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


PLACEHOLDER_PREFIX = "resume-"
_PLACEHOLDER = re.compile(rf"^{PLACEHOLDER_PREFIX}(\d+)-(\d+)$")


def placeholder_owner(pipeline_id: int, resume_number: int) -> str:
    """The owner a reclaim writes while the resume run is being launched."""
    return f"{PLACEHOLDER_PREFIX}{pipeline_id}-{resume_number}"


def parse_placeholder(owner: str) -> tuple[int, int] | None:
    """``(pipeline_id, resume_number)`` of a placeholder owner, None for a run id."""
    match = _PLACEHOLDER.match(owner)
    return (int(match.group(1)), int(match.group(2))) if match else None


def is_placeholder(owner: str) -> bool:
    return parse_placeholder(owner) is not None


def resume_run_key(pipeline_id: int, resume_number: int) -> str:
    """The Dagster run key of a pipeline's resume number ``resume_number``."""
    return f"recovery-{pipeline_id}-{resume_number}"


def placeholder_run_key(owner: str) -> str:
    parsed = parse_placeholder(owner)
    if parsed is None:
        raise ValueError(f"not a placeholder owner: {owner!r}")
    return resume_run_key(*parsed)


def in_process_origin(run_id: str) -> str:
    """The first run of a pipeline that ran on a throw-away instance (``execute_in_process`` given none).

    No Dagster instance holds that run, so it is recorded as no run id: a sensor that resumes only the
    pipelines whose first run its instance holds may still resume this one, as any of its deployment's may.
    """
    return f"in-process-{run_id}"


def takeover_message(pipeline_id: int, cause: str | None, resume_number: int,
                     heartbeat_age_seconds: float | None = None) -> str:
    """What the recovery pass marks a superseded run FAILURE with: what happened and what took over."""
    silent = f" for {heartbeat_age_seconds:.0f} s" if heartbeat_age_seconds is not None else ""
    why = {"owner_run_dead": "Dagster reported its run dead",
           "heartbeat": f"its run worker stopped heartbeating{silent}",
           "node_died": "a step process of it died (reported by the process that watched it)",
           "node_heartbeat": f"a step of it stopped heartbeating{silent} while its run worker went on",
           "stalled": "a node made no progress within its stall timeout",
           "deadline": "its hard deadline passed"}.get(cause or "", f"it was orphaned ({cause})")
    return (f"recovery-ext: pipeline {pipeline_id} was taken over because {why}; "
            f"resumed as resume #{resume_number} (run key {resume_run_key(pipeline_id, resume_number)})")


def given_up_message(pipeline_id: int, reason: str) -> str:
    return f"recovery-ext: pipeline {pipeline_id} given up: {reason}"


def superseded_run_message(run_id: str, pipeline_id: int, *, owner: str | None = None,
                           resume_number: int | None = None, resume_run_id: str | None = None,
                           unknown: bool = False) -> str:
    """What a run that finds itself superseded is failed with: which run continues its pipeline."""
    head = f"recovery-ext: run {run_id} was superseded: pipeline {pipeline_id} was reclaimed"
    if unknown:
        return head + "; see `recovery-ext pipelines show` for its resume run"
    if resume_number is None:
        return head + f" (owner now {owner})"
    key = resume_run_key(pipeline_id, resume_number)
    named = f"run {resume_run_id} (run key {key})" if resume_run_id else f"the run with run key {key}"
    return head + f" and continues in resume #{resume_number}, {named}"


def jsonable(value: Any) -> Any:
    """``value`` made JSON-safe for display: datetimes as ISO text, blobs as their size, dataclasses as dicts,
    anything else JSON does not know as its ``str``."""
    return json.loads(json.dumps(value, default=_lenient))


def _lenient(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):  # a bad row: a blob where text belongs
        return f"<{len(bytes(value))} bytes>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return str(value)


# JSON column values: the exact form both databases store, and decoding that never raises.


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
