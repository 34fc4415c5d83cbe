"""What the orphan sensor asks Dagster and tells it: batched run lookups, resume run requests
that keep what the user launched, and stopping the runs a reclaim superseded.

Every lookup is batched (one ``get_runs``/``get_run_ids`` per ``BATCH`` runs), never one query per
orphan: a tick with thousands of orphans spends its time in the store, not in Dagster round trips.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC
from typing import Any, overload

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, JobDefinition, RunRequest, RunsFilter

from recovery_ext._store.database import chunks
from recovery_ext._conventions import is_placeholder, placeholder_run_key, resume_run_key
from recovery_ext._recovery.protocol import OwnerStates, ResumeStates, StopOutcome, superseded_message
from recovery_ext._store.models import GivenUp, Reclaimed
from recovery_ext._classify.redaction import MASK, redact, redact_config
from recovery_ext._dagster.tags import TAG_PARENT_RUN as PARENT_RUN_TAG
from recovery_ext._dagster.tags import TAG_OP_SELECTION, TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM
from recovery_ext._dagster.tags import TAG_WILL_RETRY as WILL_RETRY_TAG
from recovery_ext._dagster.tags import NO_DAGSTER_RETRY

log = logging.getLogger("recovery_ext.sensors")

BATCH = 500
# Dagster's own tag names (dagster._core.storage.tags); spelled out to stay off private modules.
RUN_KEY_TAG = "dagster/run_key"
PRIORITY_TAG = "dagster/priority"
PARTITION_TAG = "dagster/partition"
# a single-run backfill of a partition range (BackfillPolicy.single_run) tags its one run with the range
PARTITION_RANGE_TAGS = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")
SYSTEM_PREFIXES = ("dagster/", ".dagster/", "recovery/", "dagster-")

# How long a failed owner run without Dagster's retry decision (the dagster/will_retry tag) is left
# to that decision. Dagster's daemon writes the tag within its next event-log pass if the failure
# path did not.
RETRY_DECISION_GRACE_SECONDS = 30.0
# How long one tick spends writing the take-over's message into superseded runs that had already ended
# (an engine event each: a few ms on PostgreSQL, more on Dagster's per-run SQLite event logs).
EXPLAIN_BUDGET_SECONDS = 1.0

LIVE_STATUSES = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
# A resume run in these states has not had its chance to attach yet: its reservation is extended.
WAITING_STATUSES = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING)
FINISHED_STATUSES = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.SUCCESS)

def classify_owner_runs(instance: DagsterInstance, run_ids: Sequence[str]) -> OwnerStates:
    """Three id-only queries per ``BATCH`` owners (no run is deserialized), plus one for the
    retries of runs Dagster is retrying.

    With run retries on, Dagster writes a failed run's status first and its ``dagster/will_retry``
    tag just after: a failed run without that tag yet is left to Dagster's decision for
    ``RETRY_DECISION_GRACE_SECONDS`` after it ended, so the sensor never races the retry it would
    otherwise stand aside for."""
    dead: list[str] = []
    will_retry: list[str] = []
    undecided: list[str] = []
    canceled: list[str] = []
    canceling: list[str] = []
    retries_on = bool(getattr(instance, "run_retries_enabled", False))
    for part in chunks(list(run_ids), BATCH):
        ids = list(part)
        canceling += instance.get_run_ids(filters=RunsFilter(run_ids=ids, statuses=[DagsterRunStatus.CANCELING]))
        canceled += instance.get_run_ids(filters=RunsFilter(run_ids=ids, statuses=[DagsterRunStatus.CANCELED]))
        failed = instance.get_run_ids(filters=RunsFilter(run_ids=ids, statuses=[DagsterRunStatus.FAILURE]))
        if failed:
            retried = set(instance.get_run_ids(filters=RunsFilter(run_ids=failed, statuses=[DagsterRunStatus.FAILURE],
                                                                  tags={WILL_RETRY_TAG: "true"})))
            will_retry += [r for r in failed if r in retried]
            rest = [r for r in failed if r not in retried]
            if retries_on and rest:
                decided = set(instance.get_run_ids(filters=RunsFilter(run_ids=rest, tags={WILL_RETRY_TAG: "false"})))
                undecided += [r for r in rest if r not in decided]
                rest = [r for r in rest if r in decided]
            dead += rest
    deciding = _still_deciding(instance, undecided, time.time())
    dead += [r for r in undecided if r not in deciding]
    retry_ended = _retries_ended(instance, will_retry)
    dead += [r for r in will_retry if r in retry_ended]
    return OwnerStates(dead, [r for r in will_retry if r not in retry_ended] + deciding + canceling, canceled)


def _still_deciding(instance: DagsterInstance, run_ids: Sequence[str], now: float) -> list[str]:
    """Failed runs with no ``dagster/will_retry`` tag yet that ended less than the grace ago."""
    deciding: list[str] = []
    for part in chunks(list(run_ids), BATCH):
        for record in instance.get_run_records(filters=RunsFilter(run_ids=list(part))):
            ended = record.end_time
            if ended is None and record.update_timestamp is not None:  # failed outside a run: last update
                stamp = record.update_timestamp
                ended = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
            if ended is not None and now - ended < RETRY_DECISION_GRACE_SECONDS:
                deciding.append(record.dagster_run.run_id)
    return deciding


def _retries_ended(instance: DagsterInstance, run_ids: Sequence[str]) -> set[str]:
    """Runs whose Dagster retry exists and finished without taking the pipeline over."""
    ended: set[str] = set()
    for part in chunks(list(run_ids), BATCH):
        for child in instance.get_runs(filters=RunsFilter(tags={PARENT_RUN_TAG: list(part)})):
            if child.status in FINISHED_STATUSES:
                ended.add(child.tags[PARENT_RUN_TAG])
    return ended


def runs_by_id(instance: DagsterInstance, run_ids: Iterable[str],
               statuses: Sequence[DagsterRunStatus] = ()) -> dict[str, DagsterRun]:
    found: dict[str, DagsterRun] = {}
    for part in chunks(sorted(set(run_ids)), BATCH):
        for run in instance.get_runs(filters=RunsFilter(run_ids=list(part), statuses=list(statuses))):
            found[run.run_id] = run
    return found


def held_run_ids(instance: DagsterInstance, run_ids: Iterable[str]) -> set[str]:
    """Which of ``run_ids`` this instance holds: ids only, no run deserialized (a tick after a mass kill
    checks thousands)."""
    return {run_id for part in chunks(sorted(set(run_ids)), BATCH)
            for run_id in instance.get_run_ids(filters=RunsFilter(run_ids=list(part)))}


def runs_by_run_key(instance: DagsterInstance, run_keys: Iterable[str]) -> dict[str, DagsterRun]:
    """The runs created for these run keys, whichever sensor created them."""
    found: dict[str, DagsterRun] = {}
    for part in chunks(sorted(set(run_keys)), BATCH):
        for run in instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: list(part)})):
            key = run.tags.get(RUN_KEY_TAG)
            if key is None:  # filtered by the tag: every run has it
                continue
            if key not in found or found[key].status in FINISHED_STATUSES:
                found[key] = run
    return found


def watch_resume_runs(instance: DagsterInstance, placeholders: Sequence[str]) -> ResumeStates:
    keys = {placeholder_run_key(ph): ph for ph in placeholders}
    existing = runs_by_run_key(instance, keys)

    def by_status(statuses: Sequence[DagsterRunStatus]) -> list[str]:
        return [keys[k] for k, r in existing.items() if r.status in statuses]

    return ResumeStates({keys[k] for k in existing}, by_status(WAITING_STATUSES),
                        by_status((DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS)),
                        by_status((DagsterRunStatus.CANCELED,)))


class OriginRuns:
    """The first runs of pipelines, looked up in batches and kept (what a run was launched with never changes)."""

    def __init__(self, max_size: int = 50_000) -> None:
        self.max_size = max_size
        self._runs: dict[str, DagsterRun | None] = {}

    def get(self, instance: DagsterInstance, run_ids: Iterable[str]) -> dict[str, DagsterRun | None]:
        wanted = {r for r in run_ids if r}
        missing = wanted - self._runs.keys()
        if missing:
            found = runs_by_id(instance, missing)
            if len(self._runs) + len(missing) > self.max_size:
                self._runs.clear()
            self._runs.update({r: found.get(r) for r in missing})
        return {r: self._runs.get(r) for r in wanted}


def carried_tags(origin: DagsterRun | None) -> dict[str, str]:
    """The tags the user launched with: user tags, priority and partition; not Dagster's system tags."""
    if origin is None:
        return {}
    tags = {k: v for k, v in origin.tags.items() if not k.startswith(SYSTEM_PREFIXES)}
    for kept in (PRIORITY_TAG, PARTITION_TAG, *PARTITION_RANGE_TAGS):
        if kept in origin.tags:
            tags[kept] = origin.tags[kept]
    selection = origin.resolved_op_selection or origin.op_selection
    if selection:
        # the resolved op names: the run worker restricts the resume run to them (replay.py)
        tags[TAG_OP_SELECTION] = json.dumps(sorted(selection))
    return tags


@overload
def unmasked(params: Mapping[str, Any], original: object) -> Mapping[str, Any]: ...
@overload
def unmasked(params: object, original: object) -> object: ...
def unmasked(params: object, original: object) -> object:
    """The recorded run config with each value masked when it was stored (an ``api_key``, a URL's
    password) taken back from the first run's own config, which Dagster keeps."""
    if isinstance(params, Mapping) and isinstance(original, Mapping):
        return {k: unmasked(v, original[k]) if k in original else v for k, v in params.items()}
    if isinstance(params, list) and isinstance(original, (list, tuple)) and len(params) == len(original):
        return [unmasked(v, o) for v, o in zip(params, original, strict=True)]
    if isinstance(params, str) and MASK in params and original != params and (
            params == MASK or (isinstance(original, str) and redact_config(original) == params)):
        return original
    return params


def resume_request(r: Reclaimed, origin: DagsterRun | None = None, job: JobDefinition | None = None) -> RunRequest:
    """The resume run of ``r``: the run config and what the user launched the first run with."""
    tags = carried_tags(origin)
    partition_key = None
    asset_selection = sorted(origin.asset_selection) if origin and origin.asset_selection else None
    # an asset job (or the implicit one: no definition here) takes its partitions from the selected assets
    if PARTITION_TAG in tags and ((job is not None and job.partitions_def is not None) or asset_selection):
        partition_key = tags.pop(PARTITION_TAG)  # Dagster derives the partition tags from the key
    tags.update({TAG_PIPELINE: str(r.pipeline_id), TAG_RESUME_NUMBER: str(r.resume_number),
                 TAG_RESUMED_FROM: r.previous_owner or ""})
    # The recorded params have their secrets masked: those come back from the first run's config in Dagster.
    run_config = r.params if isinstance(r.params, Mapping) else {}
    if origin is not None and isinstance(origin.run_config, Mapping):
        run_config = unmasked(run_config, origin.run_config)
    return RunRequest(run_key=resume_run_key(r.pipeline_id, r.resume_number), job_name=r.job_name,
                      run_config=run_config, tags=tags,
                      partition_key=partition_key,
                      asset_selection=asset_selection,
                      asset_check_keys=(sorted(origin.asset_check_selection, key=str)
                                        if origin and origin.asset_check_selection is not None else None))


def stop_superseded(instance: DagsterInstance, reclaimed: Sequence[Reclaimed | GivenUp],
                    message: Callable[[Reclaimed | GivenUp], str], *, budget_seconds: float = 20.0,
                    workers: int = 8, explain_budget_seconds: float = EXPLAIN_BUDGET_SECONDS) -> list[StopOutcome]:
    """Ask the run launcher to terminate every superseded run Dagster still shows live, then mark it FAILURE.

    A superseded run Dagster already shows ended (its run worker was killed: the code server marked it
    failed) gets the same message as an engine event at once, so its own log names the recovery at the
    tick that decided it, not only when the resume run starts. Those messages take at most
    ``explain_budget_seconds``: after a mass kill, a tick that reclaims thousands of pipelines explains the
    first ones and logs how many it left (each pipeline's events and its resume run's log say it too), so
    writing into thousands of dead runs' logs never holds back their resume runs.

    Best effort: a launcher that cannot reach the run (its host is gone) or answers an error is
    recorded, never raised. The runs are looked up in one batched query; the terminations run
    on a small pool so a tick with many live superseded runs stays bounded by ``budget_seconds``
    (whatever has not answered by then keeps going in the background and is reported as pending).
    """
    previous = {r.previous_owner: r for r in reclaimed if r.previous_owner and not is_placeholder(r.previous_owner)}
    if not previous:
        return []
    # Only the live ones are read whole (a few); the ended ones (thousands after a mass kill) by id, each
    # read only when its message is written.
    live = runs_by_id(instance, previous, LIVE_STATUSES)
    ended = sorted(held_run_ids(instance, previous) - set(live))
    _explain_ended(instance, ended, lambda run: message(previous[run.run_id]), explain_budget_seconds)
    if not live:
        return []

    def stop(run: DagsterRun) -> StopOutcome:
        r = previous[run.run_id]
        if not getattr(r, "owner_heartbeating", False):
            # Its run worker stopped heartbeating: frozen (SIGSTOP, swapped out) or gone. Terminating
            # it through the code server would block that server: the cancel sets a multiprocessing
            # Event the frozen worker must acknowledge, under the lock every run launch takes.
            answer = "not terminated: its run worker stopped heartbeating (frozen or gone); its writes are fenced"
        else:
            try:
                answer = "terminated" if instance.run_launcher.terminate(run.run_id) else "launcher could not reach it"
            except Exception as exc:  # noqa: BLE001 - best effort: recorded, never raised
                answer = f"terminate failed: {redact(exc)}"[:300]
        marked = False
        try:
            current = instance.get_run_by_id(run.run_id)
            if current is not None and current.status in LIVE_STATUSES:
                instance.add_run_tags(run.run_id, NO_DAGSTER_RETRY)
                instance.report_run_failed(current, message=message(r))
                marked = True
        except Exception as exc:  # noqa: BLE001
            log.warning("could not mark run %s failed: %s", run.run_id, redact(exc))
        return StopOutcome(r.pipeline_id, run.run_id, answer, marked)

    pool = ThreadPoolExecutor(max_workers=min(workers, len(live)), thread_name_prefix="rx-stop")
    futures = {pool.submit(stop, run): run for run in live.values()}
    done, pending = wait(futures, timeout=budget_seconds)
    pool.shutdown(wait=False)
    outcomes = [f.result() for f in done]
    outcomes += [StopOutcome(previous[futures[f].run_id].pipeline_id, futures[f].run_id,
                             f"no answer within {budget_seconds:.0f} s; still stopping", False) for f in pending]
    return outcomes


def _explain_ended(instance: DagsterInstance, run_ids: Sequence[str], message: Callable[[DagsterRun], str],
                   budget_seconds: float) -> int:
    """The take-over's message as an engine event in each ended run's own log, until ``budget_seconds`` are
    spent; how many runs got it."""
    deadline = time.monotonic() + budget_seconds
    for n, run_id in enumerate(run_ids):
        if time.monotonic() >= deadline:
            log.info("%d more superseded runs had already ended; the take-over is in their pipelines' events and "
                     "their resume runs' logs, not in their own (this tick spent its %.1f s for that)",
                     len(run_ids) - n, budget_seconds)
            return n
        try:
            run = instance.get_run_by_id(run_id)
            if run is not None:
                instance.report_engine_event(message(run), run)
        except Exception as exc:  # noqa: BLE001 - best effort: the pipeline row is the truth
            log.warning("could not explain the take-over on run %s: %s", run_id, redact(exc))
    return len(run_ids)


class DagsterRunControl:
    """The recovery protocol's view of Dagster, for one orphan sensor: batched run lookups, resume
    run requests that keep what the user launched, and stopping superseded runs."""

    def __init__(self, instance: DagsterInstance, jobs_by_name: Mapping[str, JobDefinition], origin_runs: OriginRuns, *,
                 stop_budget_seconds: float = 20.0) -> None:
        self.instance = instance
        self.jobs_by_name = jobs_by_name
        self.origin_runs = origin_runs
        self.stop_budget_seconds = stop_budget_seconds

    def owner_states(self, run_ids: Sequence[str]) -> OwnerStates:
        return classify_owner_runs(self.instance, run_ids)

    def resume_states(self, placeholders: Sequence[str]) -> ResumeStates:
        return watch_resume_runs(self.instance, placeholders)

    def known_runs(self, run_ids: Sequence[str]) -> set[str]:
        return held_run_ids(self.instance, run_ids)

    def resume_requests(self, awaiting: Sequence[Reclaimed]) -> list[RunRequest]:
        origins = self.origin_runs.get(self.instance, [a.origin_run_id for a in awaiting if a.origin_run_id])
        return [resume_request(a, origins.get(a.origin_run_id or ""), self.jobs_by_name.get(a.job_name))
                for a in awaiting]

    def stop_superseded(self, superseded: Sequence[Reclaimed | GivenUp]) -> list[StopOutcome]:
        return stop_superseded(self.instance, superseded, superseded_message, budget_seconds=self.stop_budget_seconds)
