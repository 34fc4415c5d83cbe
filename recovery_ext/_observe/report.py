"""``recovery-ext report PIPELINE --html FILE``: one self-contained HTML page (inline CSS and SVG, no script,
no external asset) drawing a pipeline across its runs."""

from __future__ import annotations

import datetime as dt
import math
from html import escape
from itertools import pairwise
from typing import Any

from recovery_ext._observe.timeline import Interval, Run, Timeline
from recovery_ext._store.ledger import SKIPPED_NOTE

WIDTH = 1320
LABEL_W = 170
RIGHT_PAD = 24
# One colour per run (epoch), reused in order; faults, reclaims and waits have their own.
RUN_COLOURS = ("#3b82f6", "#8b5cf6", "#14b8a6", "#f59e0b", "#ec4899", "#64748b")
FAULT, RECLAIM, WAIT, DONE, FAILED = "#dc2626", "#ea580c", "#eab308", "#16a34a", "#b91c1c"
# A provider call by what became of its answer (the ledger's judgement).
FATE_COLOURS = {"kept": "#475569", "saved": "#0d9488", "wasted": "#dc2626", "unsettled": "#a3a3a3",
                "in_flight": "#f59e0b"}
FATE_TEXT = {"kept": "kept by its run", "saved": "saved by resume: skipped or replayed, not paid again",
             "wasted": "wasted: never checkpointed",
             "unsettled": "answered, item not checkpointed yet",
             "in_flight": "in flight at a crash: outcome unknown"}
OUTCOME_TEXT = {"completed": "completed", "failed": "failed", "canceled": "canceled", "crashed": "crashed",
                "superseded": "superseded", "running": "running", "never_started": "never started"}

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; padding: 28px 32px 40px; background: #f6f7f9; color: #1f2937;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; font-weight: 650; }
h2 { font-size: 15px; margin: 28px 0 10px; font-weight: 650; color: #374151; }
.sub { color: #6b7280; margin-bottom: 18px; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 999px; font-size: 12px; font-weight: 600;
         vertical-align: 3px; margin-left: 8px; color: #fff; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { background: #fff; border: 1px solid #e5e7eb; border-radius: 10px; padding: 9px 14px; min-width: 128px; }
.card .v { font-size: 22px; font-weight: 650; }
.card .k { color: #6b7280; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .d { color: #6b7280; font-size: 12px; }
.panel { background: #fff; border: 1px solid #e5e7eb; border-radius: 10px; padding: 12px 8px 6px; }
.panel svg { display: block; min-width: 900px; }
svg text { font-family: inherit; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid #e5e7eb; border-radius: 10px;
        overflow: hidden; font-size: 13px; }
th, td { text-align: left; padding: 7px 12px; border-bottom: 1px solid #f0f1f3; vertical-align: top; }
th { background: #f9fafb; color: #4b5563; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td.at, #runs code { white-space: nowrap; }
#events code { word-break: break-word; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 3px; margin-right: 6px; }
.legend { display: flex; gap: 18px; flex-wrap: wrap; color: #4b5563; font-size: 12px; margin: 8px 10px 4px; }
.muted { color: #9ca3af; }
code { font-size: 12px; }
"""


def render_html(t: Timeline) -> str:
    p = t.pipeline
    status = p.shown_status
    colour = {"completed": DONE, "failed": FAILED, "canceled": "#6b7280", "waiting": "#ca8a04"}.get(status, "#2563eb")
    crashes = sum(r.outcome == "crashed" for r in t.runs)
    kept = sum(r.items_done for r in t.runs if r.outcome in ("crashed", "superseded"))
    items_total = sum(r.items_done for r in t.runs)
    down = _downtime(t)
    cards = [
        ("runs", str(len(t.runs)), f"{crashes} crashed" if crashes else "no crash"),
        ("reclaims", str(sum(m.kind == "reclaim" for m in t.markers)),
         ", ".join(sorted({r.cause or "?" for r in t.runs if r.began == "reclaimed"})) or "-"),
        ("items done", str(items_total), " + ".join(str(r.items_done) for r in t.runs) + " by run"),
        ("kept across crashes", str(kept), "items not redone by a later run"),
        ("time without a run", _duration(down), "faults and resume launches"),
        ("waited on providers", _duration(t.waited_seconds),
         " · ".join(f"{kind} {_duration(seconds)}" for kind, seconds in sorted(t.waited_on.items()))
         or "outages, rate budgets, spend caps, provider jobs"),
    ]
    cards += _cost_cards(t.costs)
    cards += _cap_cards(t.spend_caps)
    card_html = "".join(f'<div class="card" data-card="{escape(k)}"><div class="k">{escape(k)}</div>'
                        f'<div class="v">{escape(v)}</div><div class="d">{escape(d)}</div></div>' for k, v, d in cards)
    title = f"Pipeline {p.id} · {p.job_name}"
    in_flight = bool(t.call_fates.get("in_flight"))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f'<h1 id="title">{escape(title)}<span class="badge" style="background:{colour}" id="status">'
        f"{escape(status)}</span></h1>"
        f'<div class="sub">created {_when(p.created_at)} · '
        f"{'finished ' + _when(p.completed_at) if p.completed_at else 'as of ' + _when(t.end)} · "
        f"{_duration((t.end - t.start).total_seconds())} · epoch {p.epoch}, {p.resume_count} resume(s) of "
        f"{p.max_resumes} allowed</div>"
        f'<div class="cards">{card_html}</div>'
        f'<h2>Timeline</h2><div class="panel">{_svg(t)}{_legend(bool(t.calls), in_flight)}{_sampled(t)}</div>'
        f"<h2>Runs</h2>{_runs_table(t)}"
        + f"<h2>Events</h2>{_events_table(t)}"
        '<p class="muted">Times are UTC, read on the database clock. Generated by recovery-ext.</p>'
        "</body></html>\n"
    )


# -- the timeline --------------------------------------------------------------------------------------


class _Scale:
    def __init__(self, t: Timeline) -> None:
        self.start = t.start
        span = (t.end - t.start).total_seconds()
        self.span = span if span > 0 else 1.0
        self.x0, self.x1 = LABEL_W, WIDTH - RIGHT_PAD

    def x(self, at: dt.datetime) -> float:
        return self.x0 + (self.x1 - self.x0) * min(max((at - self.start).total_seconds() / self.span, 0.0), 1.0)


def _svg(t: Timeline) -> str:
    s = _Scale(t)
    parts: list[str] = []
    y = 30
    lanes: list[tuple[str, int, int]] = []  # (label, top, height)

    run_top, run_h = y, 46
    lanes.append(("Runs", run_top, run_h))
    parts += [_run_bar(s, r, run_top, run_h) for r in t.runs]
    y += run_h + 10
    wait_top = y
    lanes.append(("Waiting", wait_top, 22))
    parts += [_interval(s, i, wait_top, 22, WAIT) for i in t.intervals if i.lane == "waiting"]
    y += 32
    for name in t.node_names:
        lanes.append((name, y, 22))
        parts += [_interval(s, i, y, 22, _run_colour(i.epoch)) for i in t.intervals if i.lane == name]
        y += 30
    if t.calls:
        lanes.append(("Provider calls", y, 22))
        parts.append(_call_ticks(s, t, y, 22))
        y += 30
    items_top, items_h = y + 4, 90
    lanes.append(("Items done", items_top, items_h))
    parts.append(_items_curve(s, t, items_top, items_h))
    bottom = items_top + items_h + 8

    marks = []
    for m in t.markers:
        x = s.x(m.at)
        if m.kind == "fault":
            marks.append(f'<g class="fault" data-epoch="{m.epoch}"><title>{escape(m.label)} at {_when(m.at)}'
                         f'</title><line x1="{x:.1f}" y1="22" x2="{x:.1f}" y2="{bottom}" stroke="{FAULT}" '
                         f'stroke-width="1" stroke-dasharray="3 3"/>{_cross(x, run_top + run_h / 2)}</g>')
        elif m.kind in ("reclaim", "takeover", "reopened"):
            marks.append(f'<g class="reclaim" data-epoch="{m.epoch}" data-kind="{m.kind}" '
                         f'data-cause="{escape(_cause(t, m.epoch))}"><title>{escape(m.label)} at {_when(m.at)}</title>'
                         f'<line x1="{x:.1f}" y1="22" x2="{x:.1f}" y2="{bottom}" stroke="{RECLAIM}" '
                         f'stroke-width="1.2" stroke-dasharray="5 3"/>{_diamond(x, run_top + run_h / 2)}'
                         f'<text x="{x + 8:.1f}" y="{run_top - 6}" font-size="11" fill="{RECLAIM}" '
                         f'font-weight="600">{escape(m.label)}</text></g>')
        elif m.kind in ("completed", "failed", "canceled", "given_up"):
            c = DONE if m.kind == "completed" else FAILED
            marks.append(f'<g class="finish" data-kind="{m.kind}"><title>{escape(m.label)} at {_when(m.at)}</title>'
                         f'<circle cx="{x:.1f}" cy="{run_top + run_h / 2}" r="6" fill="{c}" stroke="#fff" '
                         f'stroke-width="2"/></g>')
    gaps = [_fault_gap(s, t, r, run_top, run_h) for r in t.runs]
    lane_bg = "".join(
        f'<rect x="0" y="{top - 4}" width="{WIDTH}" height="{h + 8}" fill="{"#fafbfc" if i % 2 else "#fff"}"/>'
        f'<text x="12" y="{top + h / 2 + 4}" font-size="12" fill="#374151" font-weight="'
        f'{600 if label in ("Runs", "Items done") else 400}">{escape(_clip(label, 22))}</text>'
        for i, (label, top, h) in enumerate(lanes))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" preserveAspectRatio="xMinYMin meet" '
            f'viewBox="0 0 {WIDTH} {bottom + 6}" role="img" aria-label="timeline of the pipeline\'s runs">'
            f"<defs>{_patterns()}</defs>{lane_bg}{_axis(s, bottom)}{''.join(gaps)}{''.join(parts)}"
            f"{''.join(marks)}</svg>")


def _run_bar(s: _Scale, r: Run, top: int, h: int) -> str:
    begin = r.first_activity_at or r.started_at
    end = r.ended_at or begin
    x0, x1 = s.x(begin), max(s.x(end), s.x(begin) + 3)
    colour = _run_colour(r.epoch)
    label = f"run {r.epoch} · {r.items_done} items"
    name = f"{label} · {_short(r.run_id)}" if r.run_id else label
    text = ""
    if x1 - x0 > len(name) * 6.6 + 12:
        text = name
    elif x1 - x0 > len(label) * 6.6 + 12:
        text = label
    launch = ""
    if r.first_activity_at and r.first_activity_at > r.started_at and r.began != "created":
        lx = s.x(r.started_at)
        launch = (f'<rect x="{lx:.1f}" y="{top + 10}" width="{max(x0 - lx, 0):.1f}" height="{h - 20}" '
                  f'fill="url(#launch)" stroke="{colour}" stroke-dasharray="3 2" stroke-width="1" rx="3">'
                  f"<title>run {r.epoch} launching: {_duration((r.first_activity_at - r.started_at).total_seconds())}"
                  f"</title></rect>")
    title = (f"run {r.epoch} ({r.began}{', cause ' + r.cause if r.cause else ''}), {r.run_id or 'run id unknown'}: "
             f"{OUTCOME_TEXT.get(r.outcome, r.outcome)}; {_items_text(r)}; {_when(begin)} - {_when(end)}")
    return (f'<g class="run" data-epoch="{r.epoch}" data-run-id="{escape(r.run_id or "")}" '
            f'data-outcome="{escape(r.outcome)}" data-items="{r.items_done}">{launch}'
            f'<rect x="{x0:.1f}" y="{top + 4}" width="{x1 - x0:.1f}" height="{h - 8}" rx="5" fill="{colour}">'
            f"<title>{escape(title)}</title></rect>"
            + (f'<text x="{x0 + 8:.1f}" y="{top + h / 2 + 4}" font-size="12" fill="#fff" font-weight="600">'
               f"{escape(text)}</text>" if text else "") + "</g>")


def _fault_gap(s: _Scale, t: Timeline, r: Run, top: int, h: int) -> str:
    """From a crashed run's last write to the reclaim that ended it: the fault until the heartbeat timeout saw it."""
    if r.outcome != "crashed" or r.ended_at is None:
        return ""
    nxt = next((n for n in t.runs if n.epoch > r.epoch), None)
    if nxt is None:
        return ""
    x0, x1 = s.x(r.ended_at), s.x(nxt.started_at)
    seconds = (nxt.started_at - r.ended_at).total_seconds()
    label = f"{_duration(seconds)} until the reclaim"
    text = (f'<text x="{(x0 + x1) / 2:.1f}" y="{top + h + 3}" font-size="10.5" fill="{FAULT}" '
            f'text-anchor="middle">{escape(label)}</text>') if x1 - x0 > len(label) * 5.8 else ""
    return (f'<g class="fault-gap" data-epoch="{r.epoch}"><rect x="{x0:.1f}" y="{top + 8}" '
            f'width="{max(x1 - x0, 1):.1f}" height="{h - 16}" fill="url(#fault)" stroke="{FAULT}" '
            f'stroke-width="0.8"><title>run {r.epoch} crashed: its last write, then {escape(label)}</title></rect>'
            f"{text}</g>")


def _interval(s: _Scale, i: Interval, top: int, h: int, colour: str) -> str:
    x0 = s.x(i.start)
    w = max(s.x(i.end) - x0, 2.0)
    stroke = {"failed": f' stroke="{FAILED}" stroke-width="2"', "reset": f' stroke="{FAULT}" stroke-dasharray="3 2"'}
    fill = "url(#waiting)" if i.outcome == "waiting" else colour
    opacity = "0.45" if i.outcome == "reset" else "0.9"
    what = {"reset": "interrupted (reset by recovery)", "running": "running"}.get(i.outcome, i.outcome)
    note = f": {i.note}" if i.note else ""
    epoch = f"run {i.epoch} " if i.epoch is not None else ""
    return (f'<g class="interval" data-lane="{escape(i.lane)}" data-outcome="{escape(i.outcome)}" '
            f'data-epoch="{"" if i.epoch is None else i.epoch}"><rect x="{x0:.1f}" y="{top}" width="{w:.1f}" '
            f'height="{h}" rx="3" fill="{fill}" fill-opacity="{opacity}"{stroke.get(i.outcome, "")}>'
            f"<title>{escape(f'{i.lane}: {epoch}{what}{note}, {_when(i.start)} - {_when(i.end)}')}</title></rect></g>")


def _call_ticks(s: _Scale, t: Timeline, top: int, h: int) -> str:
    """One tick per provider call (at most one per pixel and fate), coloured by what became of its answer."""
    drawn: set[tuple[int, str]] = set()
    ticks = []
    for call in t.calls:
        x, fate = s.x(call["recorded_at"]), call["fate"]
        if (round(x), fate) in drawn:
            continue
        drawn.add((round(x), fate))
        ticks.append(f'<rect x="{x - 1:.1f}" y="{top + (0 if fate == "wasted" else 4)}" width="2.4" '
                     f'height="{h - (0 if fate == "wasted" else 8)}" fill="{FATE_COLOURS.get(fate, "#a3a3a3")}"/>')
    counts = {fate: t.call_fates.get(fate, 0) for fate in FATE_COLOURS}
    return (f'<g class="calls" data-calls="{t.call_count}" '
            + " ".join(f'data-{fate}="{n}"' for fate, n in counts.items())
            + f'><title>{escape(", ".join(f"{n} {FATE_TEXT[f]}" for f, n in counts.items() if n))}</title>'
            + "".join(ticks) + "</g>")


def _items_curve(s: _Scale, t: Timeline, top: int, h: int) -> str:
    total = t.item_count
    if not total or not t.item_times:
        return (f'<text x="{s.x0 + 8}" y="{top + h / 2 + 4}" font-size="12" fill="#9ca3af">'
                "no item checkpoints</text>")
    # Downsample to at most ~600 steps: one point per run change and per pixel column. The i-th time is the
    # (i * step)-th checkpoint, the last one the last checkpoint.
    points: list[tuple[float, float, int | None]] = []
    for i, (epoch, at) in enumerate(t.item_times, start=1):
        n = total if i == len(t.item_times) else min(total, i * t.item_times_step)
        x, y = s.x(at), top + h - (h - 6) * n / total
        if points and points[-1][2] == epoch and x - points[-1][0] < 2 and n != total:
            points[-1] = (points[-1][0], y, epoch)
            continue
        points.append((x, y, epoch))
    prev: tuple[float, float]
    segs, prev, prev_epoch = [], (s.x0, top + h), points[0][2]
    for x, y, epoch in points:
        # Flat while nothing is checkpointed (in the colour of the run that did the last item), up per item.
        segs.append(f'<path d="M{prev[0]:.1f},{prev[1]:.1f} H{x:.1f}" fill="none" '
                    f'stroke="{_run_colour(prev_epoch)}" stroke-width="2.2"/>'
                    f'<path d="M{x:.1f},{prev[1]:.1f} V{y:.1f}" fill="none" stroke="{_run_colour(epoch)}" '
                    f'stroke-width="2.2"/>')
        prev, prev_epoch = (x, y), epoch
    segs.append(f'<path d="M{prev[0]:.1f},{prev[1]:.1f} H{s.x1:.1f}" fill="none" stroke="#9ca3af" '
                f'stroke-width="1" stroke-dasharray="2 3"/>')
    return (f'<g class="items-curve" data-items="{total}">{"".join(segs)}'
            f'<text x="{s.x1 - 4:.1f}" y="{top + 12}" font-size="11" fill="#4b5563" text-anchor="end">'
            f"{total} items</text></g>")


def _sampled(t: Timeline) -> str:
    """What the drawing leaves out, said on the page: nothing, or every how-many-th row it drew."""
    notes = []
    if t.item_times_step > 1:
        notes.append(f"the item curve is drawn through every {t.item_times_step}th of the {t.item_count:,} item "
                     "checkpoints (all runs, first to last); every count on this page is of all of them")
    if t.calls_step > 1:
        notes.append(f"one provider-call tick is drawn per {t.calls_step} of the {t.call_count:,} calls; the "
                     "call figures count all of them")
    skipped = t.costs.get("skipped_rows") or 0
    if skipped:
        notes.append(f"{skipped} {SKIPPED_NOTE}")
    return "".join(f'<p class="muted" data-sampled>{escape(n)}.</p>' for n in notes)


def _axis(s: _Scale, bottom: int) -> str:
    step = _tick_step(s.span)
    epoch0 = s.start.timestamp()
    first = math.ceil(epoch0 / step) * step - epoch0  # ticks on round times
    ticks, n = [], 0
    while first + n * step <= s.span + 1e-9:
        at = s.start + dt.timedelta(seconds=first + n * step)
        x = s.x(at)
        label = at.astimezone(dt.UTC).strftime("%H:%M:%S.%f" if step < 1 else
                                               "%H:%M:%S" if step < 86400 else "%m-%d %H:%M")
        label = label[:-5] if step < 1 else label
        ticks.append(f'<line x1="{x:.1f}" y1="18" x2="{x:.1f}" y2="{bottom}" stroke="#eef0f3"/>'
                     f'<text x="{x:.1f}" y="13" font-size="10.5" fill="#6b7280" text-anchor="middle">{label}</text>')
        n += 1
    return "".join(ticks)


def _tick_step(span: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 12:
            return step
    return span / 10


def _patterns() -> str:
    def hatch(pid: str, colour: str, bg: str) -> str:
        return (f'<pattern id="{pid}" width="6" height="6" patternUnits="userSpaceOnUse" '
                f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{bg}"/>'
                f'<line x1="0" y1="0" x2="0" y2="6" stroke="{colour}" stroke-width="2"/></pattern>')
    return hatch("fault", "#fca5a5", "#fef2f2") + hatch("waiting", "#facc15", "#fefce8") + \
        hatch("launch", "#d1d5db", "#f9fafb")


def _cross(x: float, y: float) -> str:
    return (f'<path d="M{x - 5:.1f},{y - 5:.1f} L{x + 5:.1f},{y + 5:.1f} M{x + 5:.1f},{y - 5:.1f} '
            f'L{x - 5:.1f},{y + 5:.1f}" stroke="{FAULT}" stroke-width="3" stroke-linecap="round"/>')


def _diamond(x: float, y: float) -> str:
    return (f'<path d="M{x:.1f},{y - 8:.1f} L{x + 8:.1f},{y:.1f} L{x:.1f},{y + 8:.1f} L{x - 8:.1f},{y:.1f} Z" '
            f'fill="{RECLAIM}" stroke="#fff" stroke-width="1.5"/>')


def _legend(with_calls: bool = False, in_flight: bool = False) -> str:
    shown = ("kept", "saved", "wasted", *(("in_flight",) if in_flight else ()))
    fates = [(f"background:{FATE_COLOURS[f]}", f"call {FATE_TEXT[f]}") for f in shown] if with_calls else []
    entries = [(f"background:{RUN_COLOURS[0]}", "a run (one colour per epoch)"),
               (f"background:{FAULT}", "crash: the run's last write, then nothing until the reclaim"),
               (f"background:{RECLAIM}", "reclaim / takeover"),
               (f"background:{WAIT}", "waiting (a provider outage, a rate budget, a spend cap, a provider job)"),
               (f"background:{DONE}", "pipeline finished"), *fates]
    return '<div class="legend">' + "".join(
        f'<span><span class="swatch" style="{style}"></span>{escape(text)}</span>' for style, text in entries) \
        + "</div>"


# -- tables ------------------------------------------------------------------------------------------------


def _runs_table(t: Timeline) -> str:
    rows = []
    for r in t.runs:
        began = {"created": "first run", "reclaimed": f"reclaimed ({r.cause or 'unknown cause'})",
                 "taken_over": "re-execution / run retry", "reopened_for_degraded": "redo of degraded items"}[r.began]
        nodes = ", ".join(f"{escape(n)} {c}" for n, c in sorted(r.items_by_node.items())) or "-"
        others = {k: n for k, n in r.items.items() if k != "completed"}
        items = f"{r.items_done}" + "".join(f" ({n} {k})" for k, n in sorted(others.items()))
        rows.append(
            f'<tr class="run-row" data-epoch="{r.epoch}"><td><span class="swatch" style="background:'
            f'{_run_colour(r.epoch)}"></span>{r.epoch}</td><td><code>{escape(r.run_id or "-")}</code></td>'
            f'<td>{escape(began)}</td><td class="at">{_clock(r.first_activity_at or r.started_at)}</td>'
            f'<td class="at">{_clock(r.ended_at)}</td>'
            f'<td class="outcome">{escape(OUTCOME_TEXT.get(r.outcome, r.outcome))}</td>'
            f'<td class="n items" title="{escape(_items_text(r))}">{escape(items)}</td><td>{nodes}</td>'
            + (f'<td class="calls">{escape(_calls_text(r))}</td>' if t.calls else "") + "</tr>")
    return ('<table id="runs"><thead><tr><th>epoch</th><th>run</th><th>began as</th><th>first write</th><th>ended</th>'
            "<th>outcome</th><th>items</th><th>items by node</th>"
            + ("<th>provider calls</th>" if t.calls else "") + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _events_table(t: Timeline, limit: int = 200) -> str:
    shown = t.events[-limit:]
    if not shown:
        return '<p class="muted">No events recorded (events expire after the retention).</p>'
    rows = "".join(
        f'<tr class="event" data-kind="{escape(e["kind"])}"><td class="at">{_when(e["created_at"])}</td>'
        f'<td>{escape(e["kind"])}'
        f"</td><td><code>{escape(_payload(e.get('payload')))}</code></td></tr>" for e in shown)
    more = f'<p class="muted">{len(t.events) - limit} older events not shown.</p>' if len(t.events) > limit else ""
    return f'<table id="events"><thead><tr><th>at</th><th>kind</th><th>details</th></tr></thead><tbody>{rows}' \
           f"</tbody></table>{more}"


# -- formatting --------------------------------------------------------------------------------------------


def _run_colour(epoch: int | None) -> str:
    return RUN_COLOURS[((epoch or 1) - 1) % len(RUN_COLOURS)]


def _cause(t: Timeline, epoch: int | None) -> str:
    run = next((r for r in t.runs if r.epoch == epoch), None)
    return (run.cause or run.began) if run else ""


def _downtime(t: Timeline) -> float:
    """Seconds between a run's end and the next run's first write (crash detection plus launch)."""
    total = 0.0
    for a, b in pairwise(t.runs):
        if a.outcome in ("crashed", "superseded") and a.ended_at and b.first_activity_at:
            total += max((b.first_activity_at - a.ended_at).total_seconds(), 0.0)
    return total


def _items_text(r: Run) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(r.items.items())) or "no items"


def _calls_text(r: Run) -> str:
    if not r.calls:
        return "-"
    text = f"{r.spent('calls'):.0f} calls, {r.spent('tokens'):,.0f} tokens"
    if r.spent("cost"):
        text += f", {_money(r.spent('cost'))}"
    lost, unknown = r.calls.get("wasted"), r.calls.get("in_flight")
    text += f"; {lost['calls']:.0f} wasted ({lost['tokens']:,.0f} tokens)" if lost else ""
    return text + (f"; {unknown['calls']:.0f} in flight at the crash (outcome unknown)" if unknown else "")


def _cost_cards(costs: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Spent, saved by resume and wasted, as the ledger reports them (`recovery-ext costs`)."""
    if not costs or not costs.get("calls"):
        return []
    priced = bool(costs.get("cost"))

    def figure(prefix: str) -> tuple[str, str]:
        calls, tokens, cost = (costs.get(f"{prefix}{k}", 0) for k in ("calls", "tokens", "cost"))
        if prefix == "":
            tokens = costs.get("tokens_in", 0) + costs.get("tokens_out", 0)
        main = _money(cost) if priced else f"{tokens:,} tok"
        return main, f"{calls} calls, {tokens:,} tokens"

    return [("provider spent", *figure("")), ("saved by resume", *figure("saved_")),
            ("wasted", *figure("wasted_"))]


def _cap_cards(caps: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Each spend cap over the pipeline (its own, its deployment's): what is left, of what, spent and reserved."""
    cards = []
    for cap in caps:
        for kind, shown in (("tokens", lambda v: f"{v:,} tok"), ("cost", _money)):
            limit = cap.get(f"max_{kind}")
            if limit is None:
                continue
            cards.append((f"spend cap ({cap['scope']})", f"{shown(cap[f'left_{kind}'])} left",
                          f"of {shown(limit)}: {shown(cap[f'spent_{kind}'])} spent, "
                          f"{shown(cap[f'reserved_{kind}'])} reserved"))
    return cards


def _payload(value: Any) -> str:
    if not isinstance(value, dict):
        return "" if value is None else str(value)[:160]
    text = ", ".join(f"{k}={v}" for k, v in value.items() if v not in (None, "", [], {}))
    return text[:160] + ("…" if len(text) > 160 else "")


def _short(run_id: str) -> str:
    return run_id if len(run_id) <= 12 else run_id[:8] + "…"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    text = value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return text[:-3]


def _clock(value: dt.datetime | None) -> str:
    """The time of day (UTC), to the millisecond; the page's header gives the dates."""
    return "-" if value is None else _when(value)[11:]


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _money(value: float) -> str:
    # The price table's currency is the user's; shown as a plain amount.
    return f"{value:,.4f}" if value < 100 else f"{value:,.2f}"
