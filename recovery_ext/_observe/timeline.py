"""One logical pipeline across its runs, rebuilt from its history: runs (epochs), faults, reclaims, waits, items.

Every run that owned the pipeline has its own epoch. An epoch begins when the pipeline is created,
reclaimed, taken over (a re-execution or run retry) or reopened for degraded items; its run id is the
owner that node transitions and item checkpoints of that epoch name. A run whose epoch was ended by a
reclaim crashed: its last sign of life is its last heartbeat (the reclaim records how long the heartbeat
that expired had been silent) or its last recorded write, whichever is later, and the time until the
reclaim is the fault the heartbeat timeout had to detect.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from recovery_ext._store.models import PipelineHistory
from recovery_ext._store.models import wait_kind

# Pipeline transitions that start a new epoch, and how the report names the run they start.
EPOCH_STARTS = {"created": "first run", "reclaimed": "resume after a crash", "taken_over": "re-execution",
                "reopened_for_degraded": "redo of degraded items"}
FINISHED = ("completed", "failed", "canceled")



# The pipeline transitions that begin a wait: an outage's pause, a wait for the rate budget, a pause at the
# spend cap, a wait on a provider job (their reasons say which: see provider_values.py).
WAIT_BEGINS = frozenset({"outage_pause", "budget_wait", "spend_cap_wait", "provider_job_wait"})

@dataclass
class Run:
    epoch: int
    began: str                            # an EPOCH_STARTS key
    started_at: dt.datetime
    cause: str | None = None              # a reclaim's cause (heartbeat, node_heartbeat, ...)
    run_id: str | None = None
    first_activity_at: dt.datetime | None = None
    last_activity_at: dt.datetime | None = None
    last_pulse_at: dt.datetime | None = None   # a crashed run's last heartbeat, as its reclaim measured it
    ended_at: dt.datetime | None = None
    outcome: str = "running"              # completed, failed, canceled, crashed, superseded, running, never_started
    items: dict[str, int] = field(default_factory=dict)           # status -> count
    items_by_node: dict[str, int] = field(default_factory=dict)   # node -> completed or degraded items
    # provider calls made by this run: fate (kept, saved, wasted, open) -> {"calls", "tokens", "cost"}
    calls: dict[str, dict[str, float]] = field(default_factory=dict)

    def spent(self, what: str) -> float:
        return sum(figures[what] for figures in self.calls.values())

    @property
    def items_done(self) -> int:
        return sum(self.items.values())


@dataclass
class Interval:
    lane: str                  # a node name, or "waiting"
    start: dt.datetime
    end: dt.datetime
    epoch: int | None
    outcome: str               # completed, failed, reset, running, waiting
    note: str = ""


@dataclass
class Marker:
    kind: str                  # fault, reclaim, takeover, reopened, given_up, completed, failed, canceled
    at: dt.datetime
    epoch: int | None
    label: str


@dataclass
class Timeline:
    pipeline: Any
    start: dt.datetime
    end: dt.datetime
    runs: list[Run]
    intervals: list[Interval]
    markers: list[Marker]
    item_times: list[tuple[int | None, dt.datetime]]
    node_names: list[str]
    events: list[dict[str, Any]]
    waited_seconds: float
    calls: list[dict[str, Any]] = field(default_factory=list)   # each provider call: epoch, recorded_at, fate, ...
    costs: dict[str, Any] = field(default_factory=dict)         # the ledger's figures for the pipeline
    # item_times and calls hold every step-th row of the counts (see PipelineHistory)
    item_count: int = 0
    item_times_step: int = 1
    call_count: int = 0
    calls_step: int = 1
    call_fates: dict[str, int] = field(default_factory=dict)    # fate -> calls, all of them
    waited_on: dict[str, float] = field(default_factory=dict)   # seconds waited, by what it waited on
    spend_caps: list[dict[str, Any]] = field(default_factory=list)  # the pipeline's and its deployment's caps

    def as_dict(self) -> dict[str, Any]:
        """The timeline as plain values (``report --json``)."""
        return {
            "pipeline": {"id": self.pipeline.id, "job": self.pipeline.job_name, "status": self.pipeline.shown_status,
                         "resumes": self.pipeline.resume_count, "epoch": self.pipeline.epoch},
            "start": self.start, "end": self.end, "waited_seconds": round(self.waited_seconds, 3),
            "waited_on": {k: round(v, 3) for k, v in self.waited_on.items()}, "spend_caps": self.spend_caps,
            "runs": [{"epoch": r.epoch, "run_id": r.run_id, "began": r.began, "cause": r.cause,
                      "started_at": r.started_at, "ended_at": r.ended_at, "outcome": r.outcome,
                      "items": dict(r.items), "items_by_node": dict(r.items_by_node), "calls": r.calls}
                     for r in self.runs],
            "costs": self.costs,
            "markers": [{"kind": m.kind, "at": m.at, "epoch": m.epoch, "label": m.label} for m in self.markers],
        }


def build_timeline(h: PipelineHistory) -> Timeline:
    p = h.pipeline
    runs: list[Run] = []
    markers: list[Marker] = []
    intervals: list[Interval] = []
    by_epoch: dict[int, Run] = {}
    open_nodes: dict[str, tuple[dt.datetime, int | None]] = {}
    waiting_from: tuple[dt.datetime, dict[str, Any]] | None = None
    interrupted: list[Interval] = []  # node intervals an epoch change cut; they end at their run's last write
    node_names = {n.id: n.name for n in h.nodes}

    def current() -> Run | None:
        return runs[-1] if runs else None

    def seen(epoch: int | None, owner: Any, at: dt.datetime) -> None:
        run = by_epoch.get(epoch) if epoch is not None else current()
        if run is None:
            return
        if isinstance(owner, str) and owner and not owner.startswith(f"resume-{p.id}-"):
            run.run_id = run.run_id or owner
        run.first_activity_at = run.first_activity_at or at
        run.last_activity_at = at

    epoch: int | None  # a node's transition may name none
    run: Run | None
    for t in h.transitions:
        at, event, data = t["at"], t["event"], t["data"] if isinstance(t["data"], dict) else {}
        if t["entity_type"] == "pipeline":
            if event in EPOCH_STARTS:
                named = data.get("epoch")
                epoch = named if isinstance(named, int) else (runs[-1].epoch + 1 if runs else 1)
                previous = current()
                run = Run(epoch=epoch, began=event, started_at=at, cause=data.get("cause"))
                if previous is not None and previous.outcome == "running":
                    # Its end and its fault marker wait for the item checkpoints, merged below.
                    previous.outcome = "crashed" if event == "reclaimed" else "superseded"
                    silent = data.get("heartbeat_age_seconds")
                    if event == "reclaimed" and isinstance(silent, (int, float)) and silent >= 0:
                        previous.last_pulse_at = at - dt.timedelta(seconds=silent)
                if event == "reclaimed":
                    markers.append(Marker("reclaim", at, epoch, f"reclaimed ({data.get('cause') or 'unknown'})"))
                elif event == "taken_over":
                    markers.append(Marker("takeover", at, epoch, "taken over by a re-execution"))
                elif event == "reopened_for_degraded":
                    markers.append(Marker("reopened", at, epoch, "reopened for degraded items"))
                for name, (start, ep) in open_nodes.items():  # running nodes were reset with the epoch
                    interrupted.append(Interval(name, start, at, ep, "reset"))
                open_nodes.clear()
                runs.append(run)
                by_epoch[epoch] = run
                if event in ("created", "taken_over"):  # these name the run that owns the new epoch
                    seen(epoch, data.get("owner"), at)
            elif event in WAIT_BEGINS:
                waiting_from = waiting_from or (at, data)
                seen(None, None, at)
            elif t["from_status"] == "waiting" and waiting_from is not None:
                seen(None, None, at)
                intervals.append(Interval("waiting", waiting_from[0], at, _epoch_of(current()), "waiting",
                                          str(waiting_from[1].get("reason") or "")))
                waiting_from = None
            elif t["to_status"] in FINISHED:
                named = data.get("epoch")
                run = (by_epoch.get(named) if isinstance(named, int) else None) or current()
                if run is not None:
                    seen(run.epoch, data.get("owner"), at)
                    run.outcome, run.ended_at = t["to_status"], at
                kind = "given_up" if event in ("given_up", "corrupt") else t["to_status"]
                markers.append(Marker(kind, at, _epoch_of(run), _finish_label(event, data)))
        elif t["entity_type"] == "node":
            name = node_names.get(t["entity_id"], f"node {t['entity_id']}")
            epoch = data.get("epoch") if isinstance(data.get("epoch"), int) else _epoch_of(current())
            if t["to_status"] == "running":
                open_nodes[name] = (at, epoch)
                seen(epoch, data.get("owner"), at)
            elif name in open_nodes:
                start, ep = open_nodes.pop(name)
                outcome = {"pending": "reset"}.get(t["to_status"], t["to_status"])
                cut = Interval(name, start, at, ep, outcome, str(data.get("error") or ""))
                if outcome == "reset":  # reset by a reclaim or takeover: the node stopped with its run
                    interrupted.append(cut)
                else:
                    intervals.append(cut)
                    seen(epoch, data.get("owner"), at)

    for row in h.items:
        run = by_epoch.get(row["epoch"])
        if run is None:
            continue
        run.items[row["status"]] = run.items.get(row["status"], 0) + row["count"]
        run.items_by_node[row["node"]] = run.items_by_node.get(row["node"], 0) + row["count"]
        run.run_id = run.run_id or row["run_id"]
        run.first_activity_at = min(filter(None, (run.first_activity_at, row["first_at"])))
        run.last_activity_at = max(filter(None, (run.last_activity_at, row["last_at"])))

    for run in runs:
        if run.outcome in ("crashed", "superseded"):
            signs = [s for s in (run.last_activity_at, run.last_pulse_at) if s is not None]
            run.ended_at = max(signs) if signs else run.started_at
            if run.outcome == "crashed":
                what = "its last heartbeat" if run.last_pulse_at is not None and run.ended_at == run.last_pulse_at \
                    else "its last write"
                markers.append(Marker("fault", run.ended_at, run.epoch, f"run {run.epoch}: {what}"))
    for i in interrupted:
        run = by_epoch.get(i.epoch) if i.epoch is not None else None
        if run is not None and run.ended_at is not None:
            i.end = max(i.start, min(i.end, run.ended_at))
        intervals.append(i)
    fates: dict[str, int] = {}
    for figures in h.call_figures:  # summed by the database over every call, however many are drawn
        fates[figures["fate"]] = fates.get(figures["fate"], 0) + int(figures["calls"])
        run = by_epoch.get(figures["epoch"])
        if run is not None:
            into = run.calls.setdefault(figures["fate"], {"calls": 0, "tokens": 0, "cost": 0.0})
            into["calls"] += int(figures["calls"])
            into["tokens"] += int(figures["tokens"] or 0)
            into["cost"] += float(figures["cost"] or 0.0)
    end = p.completed_at if p.status in FINISHED and p.completed_at else h.now
    for name, (start, ep) in open_nodes.items():
        intervals.append(Interval(name, start, end, ep, "running"))
    if waiting_from is not None:
        intervals.append(Interval("waiting", waiting_from[0], max(end, p.waiting_until or end), _epoch_of(current()),
                                  "waiting", str(waiting_from[1].get("reason") or "")))
    last = current()
    if last is not None and last.outcome == "running":
        last.ended_at = end
        if last.first_activity_at is None:
            last.outcome = "never_started" if p.status in FINISHED else "running"
    start = p.created_at or (runs[0].started_at if runs else h.now)
    moments = [end, *(m.at for m in markers), *(i.end for i in intervals), *(t for _, t in h.item_times),
               *(c["recorded_at"] for c in h.calls)]
    waited = sum((i.end - i.start).total_seconds() for i in intervals if i.lane == "waiting")
    waited_on: dict[str, float] = {}
    for i in intervals:
        if i.lane == "waiting":
            kind = wait_kind(i.note).value
            waited_on[kind] = waited_on.get(kind, 0.0) + (i.end - i.start).total_seconds()
    return Timeline(pipeline=p, start=start, end=max(moments), runs=runs, intervals=intervals,
                    markers=sorted(markers, key=lambda m: m.at), item_times=list(h.item_times),
                    node_names=[n.name for n in h.nodes], events=h.events, waited_seconds=waited,
                    calls=list(h.calls), costs=dict(h.costs), item_count=h.item_count or len(h.item_times),
                    item_times_step=h.item_times_step, call_count=h.call_count or len(h.calls),
                    calls_step=h.calls_step, call_fates=fates, waited_on=waited_on,
                    spend_caps=[c.as_dict() for c in h.spend_caps])


def _epoch_of(run: Run | None) -> int | None:
    return run.epoch if run is not None else None


def _finish_label(event: str, data: dict[str, Any]) -> str:
    if event in ("given_up", "corrupt"):
        return f"gave up: {data.get('reason') or event}"
    if event == "failed_by_operator":
        return f"failed by the operator: {data.get('reason') or ''}".rstrip(": ")
    return event.replace("_", " ")
