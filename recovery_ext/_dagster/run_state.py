"""Recovery state shown on the Dagster run itself: a run tag and engine events in the run's log.

The application tables are the truth; this is what a user sees in the UI without a shell. A run
whose pipeline waits out a provider outage carries ``recovery/state=waiting`` and an engine event
with the reason and the next try; when it goes on, the tag becomes ``running`` and an engine event
says the wait is over. Everything here is best effort: a run storage that refuses a tag or an event
never fails the op that reports it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from typing import Any

from dagster import DagsterInstance, MetadataValue

from recovery_ext._dagster.compat import EngineEventData
from recovery_ext._classify.redaction import redact
from recovery_ext._dagster.tags import TAG_PROGRESS, TAG_STATE
from recovery_ext._store.statuses import WAITING, PipelineStatus
from recovery_ext._store.models import WaitKind, wait_kind

# The values of the run's recovery/state tag: a tag holds plain strings.
RUNNING = PipelineStatus.RUNNING.value


def _step_key(context: Any) -> str | None:
    try:
        key: str = context.get_step_execution_context().step.key
        return key
    except Exception:  # noqa: BLE001 - an op context outside a step (tests build their own)
        return None


def report(instance: DagsterInstance, run_id: str, job_name: str, message: str, *,
           metadata: Mapping[str, Any] | None = None, step_key: str | None = None, log: Any = None) -> bool:
    """One engine event in the run's log (shown in the UI's run view); False if the instance refused it."""
    try:
        values = {k: MetadataValue.text(redact(str(v))) for k, v in (metadata or {}).items() if v is not None}
        instance.report_engine_event(redact(message), engine_event_data=EngineEventData(metadata=values),
                                     step_key=step_key, job_name=job_name, run_id=run_id)
        return True
    except Exception as exc:  # noqa: BLE001 - the UI annotation must never fail the run
        if log is not None:
            log.warning(f"recovery-ext: could not record an engine event on run {run_id}: {redact(exc)}")
        return False


def set_state(instance: DagsterInstance, run_id: str, state: str, *, log: Any = None) -> bool:
    try:
        instance.add_run_tags(run_id, {TAG_STATE: state})
        return True
    except Exception as exc:  # noqa: BLE001
        if log is not None:
            log.warning(f"recovery-ext: could not tag run {run_id} {TAG_STATE}={state}: {redact(exc)}")
        return False


def current_state(instance: DagsterInstance, run_id: str) -> str | None:
    try:
        run = instance.get_run_by_id(run_id)
    except Exception:  # noqa: BLE001
        return None
    return None if run is None else run.tags.get(TAG_STATE)


class RunStateReporter:
    """Shows a node's outage pauses on its Dagster run (tag + engine events) from an op's context."""

    def __init__(self, context: Any, node: str) -> None:
        self.instance: DagsterInstance = context.instance
        self.run_id: str = context.run_id
        self.job_name: str = context.job_name
        self.node = node
        self.step_key = _step_key(context)
        self.log = getattr(context, "log", None)

    def waiting(self, seconds: float, reason: str, *, until: dt.datetime | None = None,
                kind: WaitKind | None = None, metadata: Mapping[str, Any] | None = None) -> None:
        """The pipeline pauses: ``recovery/state=waiting`` and an event with what it waits on (``kind``, default:
        told from ``reason``), the reason and the next try or check, ``until`` (the pipeline row's, on the
        database clock) being ``seconds`` from now."""
        kind = kind or wait_kind(reason)
        next_at = until or (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))
        when = next_at.astimezone(dt.UTC).strftime("%H:%M:%S UTC")
        set_state(self.instance, self.run_id, WAITING, log=self.log)
        report(self.instance, self.run_id, self.job_name,
               f"recovery-ext: {kind.doing} in {self.node}: {kind.next_label} at {when} "
               f"(in {seconds:.1f} s); reason: {reason}",
               metadata={"recovery_state": WAITING, "waiting_on": kind.value, "node": self.node,
                         kind.next_label.replace(" ", "_"): next_at.isoformat(), "wait_seconds": f"{seconds:.1f}",
                         "reason": reason, **(metadata or {})},
               step_key=self.step_key, log=self.log)

    def going_on(self, why: str) -> None:
        """The pause is over: the tag says ``running`` again and an event says so (only if it said waiting)."""
        if current_state(self.instance, self.run_id) != WAITING:
            return
        set_state(self.instance, self.run_id, RUNNING, log=self.log)
        report(self.instance, self.run_id, self.job_name,
               f"recovery-ext: waiting over in {self.node}: {why}",
               metadata={"recovery_state": RUNNING, "node": self.node}, step_key=self.step_key, log=self.log)

    def left(self, why: str) -> None:
        """The node stopped waiting without the wait being over (a stop, a lost ownership): an event says so;
        the tag is left to the run's own end."""
        report(self.instance, self.run_id, self.job_name, f"recovery-ext: {why} ({self.node})",
               metadata={"node": self.node}, step_key=self.step_key, log=self.log)

# Seconds between two progress reports of one node: a tag write and a log line each, not one per item.
PROGRESS_EVERY = 5.0


class ProgressReporter:
    """A node's item progress on its Dagster run: the run tag ``recovery/progress`` ("enrich_columns 6/12 items")
    and a line in the run's log, when the items start, at most every ``every`` seconds, and when they run out;
    never the same count twice in a row (a resumed node whose items were all done starts and ends at its total)."""

    def __init__(self, context: Any, node: str, total: int, *, every: float = PROGRESS_EVERY) -> None:
        self.instance: DagsterInstance = context.instance
        self.run_id: str = context.run_id
        self.log = getattr(context, "log", None)
        self.node, self.total, self.every = node, total, every
        self._last = float("-inf")
        self._shown: int | None = None

    def update(self, finished: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if (not final and now - self._last < self.every) or finished == self._shown:
            return
        self._last, self._shown = now, finished
        text = f"{self.node} {finished}/{self.total} items"
        try:
            self.instance.add_run_tags(self.run_id, {TAG_PROGRESS: text})
        except Exception as exc:  # noqa: BLE001 - progress shown in the UI never fails the op
            if self.log is not None:
                self.log.warning(f"recovery-ext: could not tag run {self.run_id} {TAG_PROGRESS}: {redact(exc)}")
        if self.log is not None:
            self.log.info(f"recovery-ext: {text}")
