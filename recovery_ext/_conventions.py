"""The formats the library writes in more than one place, each spelled once.

- the placeholder owner ``resume-<pipeline>-<n>`` a reclaim writes until its resume run attaches (also built in
  SQL, from :data:`PLACEHOLDER_PREFIX`, by the bulk reclaim);
- the resume run's Dagster run key ``recovery-<pipeline>-<n>``, which makes a re-requested resume idempotent;
- the messages a superseded run is failed with;
- lenient JSON coercion, for rendering to humans (the exact form, what a replay returns, is
  :func:`~recovery_ext._json_values.agreed_json`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
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
