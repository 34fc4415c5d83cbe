"""``recovery-ext``: the operator CLI over the store and the recovery scan."""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
import time
from pathlib import Path
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import click
from tabulate import tabulate

from recovery_ext._conventions import jsonable
from recovery_ext._errors import ConfigurationError, MigrationError, RecoveryError, install_hint
from recovery_ext._recovery.protocol import scan
from recovery_ext._recovery.protocol import RecoverySettings
from recovery_ext._classify.redaction import redact
from recovery_ext._store.migrations import LIBRARY, check_package
from recovery_ext._store.models import CostFigures
from recovery_ext._store.ledger import SKIPPED_NOTE
from recovery_ext._store.models import IN_PROCESS_DEPLOYMENT, Node, PassPlan, StaleItem
from recovery_ext._store.models import PruneResult
from recovery_ext._store.store import URL_ENV
from recovery_ext._store.statuses import WAITING, BreakerState, PipelineStatus, QueueStatus
from recovery_ext._store.interfaces import CliStore, SensorStore
from recovery_ext._store.models import WaitKind, wait_kind
from recovery_ext._store.models import deployment_scope, pipeline_scope

from recovery_ext._cli_spend import CAP_HEADERS, cap_rows, spend_cap
from recovery_ext._cli_common import (MAX_KINDS, ROW_ID, Age, BadArgument, DeploymentName, Duration, IntRange,
                                      Output, PollInterval, _when, command, open_store)

if TYPE_CHECKING:  # the report's modules load only when a report is asked for
    from recovery_ext._observe.timeline import Timeline

class RedactingGroup(click.Group):
    """Usage errors quote the arguments; an argument may be a URL with a password.

    A reader that stops early (``recovery-ext status | head -1``) ends the command quietly, exit 0.
    """

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:
            # click declares message Final, but it is what click prints: the one place to redact it
            exc.message = redact(exc.message)  # type: ignore[misc]
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return result
        except click.ClickException as exc:
            exc.message = redact(exc.message)  # type: ignore[misc]  # Final in click: see make_context
            raise
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            _silence_stdout()
            ctx.exit(0)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush of a closed pipe cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


@click.group(cls=RedactingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", envvar=URL_ENV, show_envvar=True, metavar="URL",
              help="Application tables (postgresql://... or sqlite:///...). Default: SQLite under $DAGSTER_HOME.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output for every command.")
@click.pass_context
def main(ctx: click.Context, database_url: str | None, as_json: bool) -> None:
    """Operate recovery-ext: migrations, status, recovery, stuck items and events."""
    # Nothing is resolved (no default folder made) until a command's arguments are accepted.
    # Plugin commands open the store through ``open_store`` too.
    ctx.obj = {"url": database_url, "json": as_json}
    ctx.obj["open_store"] = functools.partial(open_store, ctx.obj)


main.add_command(spend_cap)


def _migration_packages(ctx: click.Context, param: click.Parameter, packages: tuple[str, ...]) -> tuple[str, ...]:
    """Each ``--package`` checked before anything is opened or created: a typo is a usage error (exit 2)."""
    for package in packages:
        try:
            check_package(package)
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return packages


@main.command()
@click.option("--print", "print_only", is_flag=True, help="Show the SQL of pending migrations without running it.")
@click.option("--package", "packages", multiple=True, metavar="PACKAGE", callback=_migration_packages,
              help="Also apply the migrations of an application package (<package>/sql/<dialect>/NNNN_*.sql), "
                   "after the library's. Repeatable.")
@command(creates_database=True)
def migrate(store: CliStore, out: Output, print_only: bool, packages: tuple[str, ...]) -> None:
    """Apply the schema migrations in order (recorded in rx_schema_migrations, rx_app_migrations)."""
    sources = [LIBRARY, *packages]
    pending = [(source, m) for source in sources for m in store.pending_migrations(source)]
    if print_only:
        for source, m in pending:
            click.echo(f"-- {m.version:04d}_{m.name} of {source} ({store.dialect.name})\n{m.sql.strip()}\n")
        if not pending:
            click.echo("-- the schema is up to date", err=True)
        return
    for source, m in pending:
        out.progress(f"applying {m.version:04d}_{m.name} of {source} ...")
    applied = [(source, m) for source in sources for m in store.migrate(source)]
    out.emit({"applied": [f"{m.version:04d}_{m.name}" if source == LIBRARY else f"{source}:{m.version:04d}_{m.name}"
                          for source, m in applied]},
             lambda: click.echo(f"applied {len(applied)} migration(s)" if applied else "the schema is up to date"))


@main.command()
@click.option("--threshold", type=Duration(), default="10m", show_default=True,
              help="Processing items without a heartbeat deadline (legacy rows) started longer ago than this are "
                   "stuck; the others are stuck when their heartbeat deadline passed or their pipeline was reclaimed.")
@click.option("--deployment", metavar="NAME", type=DeploymentName(),
              help="Only the pipelines of this deployment (one Dagster instance).")
@command
def status(store: CliStore, out: Output, threshold: float, deployment: str | None) -> None:
    """Pipelines by deployment and status, orphans and stuck items now, auto-recovered in 24 h, dead items."""
    out.note_unknown_deployment(store, deployment)
    data: dict[str, Any] = {
        "pipelines": store.reports.pipeline_summary(deployment=deployment),
        "orphans": [o.__dict__ for o in store.recovery.find_orphans(deployment=deployment)],
        "stuck_items": [_stuck(i) for i in store.queue.stale_items(older_than_seconds=threshold)],
        "waiting_items": [{"id": i.id, "queue": i.queue, "attempts": i.attempts, "available_at": i.available_at,
                           "last_error": i.last_error} for i in store.queue.waiting_items()],
        "auto_recovered_24h": {"pipelines": store.reports.count_events("pipeline_recovered", within_seconds=86400),
                               "items": store.reports.count_events("item_reset", within_seconds=86400)},
        "dead_items": [{"id": i.id, "queue": i.queue, "attempts": i.attempts, "last_error": i.last_error}
                       for i in store.reports.dead_items()],
        "queues": store.reports.queue_summary(),
        "waiting": [{**w, "waiting_on": wait_kind(w["waiting_reason"]).value}
                    for w in store.providers.waiting_pipelines()],
        "circuit_breakers": [b for b in store.providers.breakers()
                             if b["state"] != BreakerState.CLOSED or b["consecutive_failures"]],
        "unwatched_pipelines": store.reports.unwatched_pipelines(),
        "stranded_pipelines": store.recovery.stranded_pipelines(),
        "unknown_status_items": store.reports.items_with_unknown_status(),
        "bad_items": store.reports.items_with_bad_values(),
        "dangling_rows": store.reports.dangling_rows(),
    }
    for orphan in data["orphans"]:
        orphan["deployment"] = store.pipelines.get_pipeline(orphan["id"]).deployment
        orphan["recovered_by"] = _recovered_by(orphan["deployment"])

    def human() -> None:
        click.echo("Pipelines by status")
        click.echo(tabulate([(r["deployment"], r["status"], r["count"], _seconds(r["avg_seconds"]))
                             for r in data["pipelines"]],
                            headers=["deployment", "status", "count", "avg duration"]) or "  (none)")
        click.echo(f"\nOrphans now: {len(data['orphans'])}")
        for o in data["orphans"]:
            click.echo(f"  - pipeline {o['id']} ({o['job_name']}) owner {o['owner']}: {o['reason']}; "
                       f"{o['recovered_by']}")
        click.echo(f"Stuck items now: {len(data['stuck_items'])}")
        for i in data["stuck_items"]:
            click.echo(f"  - item {i['id']} ({i['queue']}) worker {i['worker']} since {_when(i['started_at'])}: "
                       f"{i['reason']}")
        click.echo(f"Items waiting for their retry delay: {len(data['waiting_items'])}")
        for i in data["waiting_items"]:
            click.echo(f"  - item {i['id']} ({i['queue']}) attempt {i['attempts']} failed; retry at "
                       f"{_when(i['available_at'])}: {i['last_error']}")
        rec = data["auto_recovered_24h"]
        click.echo(f"Auto-recovered in the last 24 h: {rec['pipelines']} pipelines, {rec['items']} items")
        click.echo(f"Dead items: {len(data['dead_items'])}")
        for i in data["dead_items"]:
            click.echo(f"  - item {i['id']} ({i['queue']}) after {i['attempts']} attempts: {i['last_error']}")
        for kind in WaitKind:
            waits = [w for w in data["waiting"] if w["waiting_on"] == kind]
            if waits or kind == WaitKind.OUTAGE:
                click.echo(f"{kind.heading}: {len(waits)}")
            for w in waits:
                click.echo(f"  - pipeline {w['id']} ({w['job_name']}) waiting, {kind.next_label} "
                           f"{_when(w['waiting_until'])}: {w['waiting_reason']}")
        click.echo(f"Circuit breakers not closed: {sum(b['state'] != 'closed' for b in data['circuit_breakers'])}")
        for b in data["circuit_breakers"]:
            until = f" until {_when(b['open_until'])}" if b["state"] == BreakerState.OPEN else ""
            click.echo(f"  - {b['endpoint']}: {b['state']}{until}, {b['consecutive_failures']} failures in a row, "
                       f"opened {b['open_count']}x; last error: {(b['last_error'] or '')[:80]}")
        for u in data["unwatched_pipelines"]:
            click.echo(f"  ! pipeline {u['id']} ({u['job_name']}) owner {u['owner']}: {u['reason']}")
        for u in data["stranded_pipelines"]:
            click.echo(f"  ! pipeline {u['id']} ({u['job_name']}) of deployment {u['deployment']!r} is stranded: "
                       f"{u['reason']}")
        for i in data["unknown_status_items"]:
            click.echo(f"  ! item {i['id']} ({i['queue']}) has unknown status {i['status']!r}")
        for i in data["bad_items"]:
            click.echo(f"  ! item {i['id']} ({i['queue']}, {i['status']}): {i['reason']}")
        for d in data["dangling_rows"]:
            click.echo(f"  ! {d['rows']} {d['kind']} row(s): {d['reason']}")
        if data["queues"]:
            click.echo("\nQueues")
            click.echo(tabulate([(r["queue"], r["status"], r["count"], _seconds(r["avg_seconds"]))
                                 for r in data["queues"]], headers=["queue", "status", "count", "avg duration"]))

    out.emit(data, human)


def _recovered_by(deployment: str | None) -> str:
    """Who resumes an orphan of ``deployment``: only an orphan sensor of that deployment launches its resume run."""
    if deployment == IN_PROCESS_DEPLOYMENT:
        return ("run in a process with no Dagster instance (no DAGSTER_HOME): no orphan sensor resumes it; "
                "run it again, or under dagster dev")
    return (f"resumed by the orphan sensor of deployment {deployment} (the Dagster daemon or dagster dev of "
            "that instance); recovery-ext recover reclaims it but launches nothing")


def _stuck(item: StaleItem) -> dict[str, Any]:
    """A stuck queue item as ``status`` and ``reset-stuck`` report it (the store's one stale rule)."""
    return {"id": item.id, "queue": item.queue, "worker": item.worker, "started_at": item.started_at,
            "attempts": item.attempts, "heartbeat_deadline": item.heartbeat_deadline, "reason": item.stale_reason}


# (seconds, one, many): a duration is said in the largest unit it fills twice, or once exactly ("1 day", "90 days").
UNITS = ((86400, "day", "days"), (3600, "h", "h"), (60, "min", "min"))


def _seconds(value: float | None) -> str:
    """A duration as an operator says it: ``45.5 s``, ``10 min``, ``12 h``, ``90 days``."""
    if value is None:
        return "-"
    for size, one, many in UNITS:
        if value >= 2 * size or (value >= size and value % size == 0):
            amount = round(value / size, 1)
            return f"{amount:g} {one if amount == 1 else many}"
    return f"{round(value, 1):g} s"


@main.group()
def pipelines() -> None:
    """Inspect pipelines."""


@pipelines.command("list")
@click.option("--status", "status_", type=click.Choice(
    [s.value for s in (PipelineStatus.PENDING, PipelineStatus.RUNNING, PipelineStatus.COMPLETED,
                       PipelineStatus.FAILED)]))
@click.option("--limit", type=IntRange(1, 10_000), default=20, show_default=True)
@click.option("--deployment", metavar="NAME", type=DeploymentName(),
              help="Only the pipelines of this deployment (one Dagster instance).")
@command
def list_pipelines(store: CliStore, out: Output, status_: str | None, limit: int, deployment: str | None) -> None:
    """The most recent pipelines."""
    out.note_unknown_deployment(store, deployment)
    rows = store.reports.list_pipelines(status=status_, limit=limit, deployment=deployment)
    out.emit([r.__dict__ for r in rows], lambda: click.echo(tabulate(
        [(p.id, p.job_name, p.deployment, p.shown_status, p.owner, p.resume_count, _when(p.created_at),
          p.gave_up_reason or "") for p in rows],
        headers=["id", "job", "deployment", "status", "owner", "resumes", "created", "gave up"])))


@pipelines.command("show")
@click.argument("pipeline_id", type=ROW_ID)
@command
def show_pipeline(store: CliStore, out: Output, pipeline_id: int) -> None:
    """Nodes, items done/total, attempts, errors and transitions of one pipeline."""
    p = store.pipelines.get_pipeline(pipeline_id)
    node_rows = store.pipelines.list_nodes(pipeline_id)
    done = store.reports.node_item_totals(pipeline_id)
    history = store.reports.transitions_for(pipeline_id=pipeline_id)
    degraded = store.providers.degraded_counts(pipeline_id)
    data = {"pipeline": {**p.__dict__, "shown_status": p.shown_status},
            "nodes": [{**n.__dict__, "items_done": done.get(n.name, 0), "items_degraded": degraded.get(n.name, 0)}
                      for n in node_rows],
            "transitions": history}

    def items(n: Node) -> str:
        if n.items_total is None:
            return "-"
        extra = f" ({degraded[n.name]} degraded)" if degraded.get(n.name) else ""
        return f"{done.get(n.name, 0)}/{n.items_total}{extra}"

    def human() -> None:
        click.echo(f"Pipeline {p.id}  {p.job_name}  {p.shown_status}  owner={p.owner}  epoch={p.epoch}  "
                   f"resumes={p.resume_count}/{p.max_resumes}")
        click.echo(f"  created {_when(p.created_at)}  heartbeat until {_when(p.heartbeat_deadline)}  "
                   f"deadline {_when(p.deadline)}")
        if p.shown_status == WAITING:
            click.echo(f"  waiting since {_when(p.waiting_since)}, next try {_when(p.waiting_until)}: "
                       f"{p.waiting_reason}")
        if degraded:
            click.echo(f"  degraded items (fallback answers): {sum(degraded.values())}; "
                       f"`recovery-ext redo-degraded {p.id}` asks the provider again")
        # only the parts that hold something: a failed pipeline has no give-up reason, a given-up one may
        # have no error, and an empty "gave up: " read as if it had given up for no reason
        shown = [f"{label}: {text}" for label, text in (("error", p.error), ("gave up", p.gave_up_reason)) if text]
        if shown:
            click.echo("  " + "  ".join(shown))
        click.echo()
        click.echo(tabulate([(n.position, n.name, n.status, n.attempts, items(n),
                              n.error_category or "", (n.error or "")[:60], n.run_id or "") for n in node_rows],
                            headers=["#", "node", "status", "attempts", "items", "category", "error", "run"]))
        click.echo("\nTransitions")
        names = {n.id: n.name for n in node_rows}  # a node's transition names the node, not its row id

        def entity(t: dict[str, Any]) -> str:
            if t["entity_type"] == "node" and t["entity_id"] in names:
                return f"node {names[t['entity_id']]}"
            return f"{t['entity_type']} {t['entity_id']}"

        click.echo(tabulate([(_when(t["at"]), entity(t), t["from_status"] or "", t["to_status"], t["event"])
                             for t in history], headers=["at", "entity", "from", "to", "event"]))

    out.emit(data, human)


@main.command()
@click.argument("pipeline_id", type=ROW_ID, required=False, metavar="[PIPELINE]")
@command
def costs(store: CliStore, out: Output, pipeline_id: int | None) -> None:
    """Provider calls, tokens and cost: spent, saved by resume (checkpointed before a crash in a node the
    resume went through again, which it did not pay for again, at what they cost then; replayed: answers the
    call journal gave a resume), wasted (paid for, never checkpointed) and in
    flight at a crash (outcome unknown), for one pipeline by node, or for all by pipeline."""
    scopes = None
    if pipeline_id is not None:
        shown = store.pipelines.get_pipeline(pipeline_id)  # NotFound: one clear error
        scopes = [pipeline_scope(pipeline_id), deployment_scope(shown.deployment or "")]
    report = store.reports.provider_costs(pipeline_id)
    caps = store.providers.spend_caps(scopes)
    if pipeline_id is not None:
        figures = report.pipelines.get(pipeline_id) or CostFigures()
        nodes = report.nodes.get(pipeline_id, {})
        data = {"pipeline_id": pipeline_id, **figures.as_dict(), "skipped_rows": report.skipped_rows,
                "nodes": {name or "(outside nodes)": n.as_dict() for name, n in sorted(nodes.items())}}
        rows = [(name or "(outside nodes)", n) for name, n in sorted(nodes.items())] + [("total", figures)]
        first = "node"
    else:
        data = report.as_dict()
        rows = [(f"{pid} {report.jobs.get(pid) or ''}".strip(), f) for pid, f in sorted(report.pipelines.items())]
        rows.append(("total", report.total))
        first = "pipeline"

    def human() -> None:
        click.echo(tabulate([(label, f.calls, f.tokens_in, f.tokens_out, f"{f.cost:.6g}",
                              f"{f.saved_calls} / {f.saved_tokens} / {f.saved_cost:.6g}",
                              f"{f.wasted_calls} / {f.wasted_tokens} / {f.wasted_cost:.6g}", f.replayed_calls,
                              f.in_flight_unknown_calls) for label, f in rows],
                            headers=[first, "calls", "tokens in", "tokens out", "cost",
                                     "saved calls/tokens/cost", "wasted calls/tokens/cost", "replayed",
                                     "in flight at a crash (unknown)"]))
        if caps:
            click.echo("\nSpend caps")
            click.echo(tabulate(cap_rows(caps), headers=CAP_HEADERS))

    data["spend_caps"] = [c.as_dict() for c in caps]
    out.emit(data, human)
    if report.skipped_rows:
        click.echo(f"warning: {report.skipped_rows} {SKIPPED_NOTE}", err=True)


@main.command()
@click.option("--limit", type=IntRange(1, 100_000), default=1000, show_default=True,
              help="Reclaim at most this many orphans.")
@command
def recover(store: SensorStore, out: Output, limit: int) -> None:
    """Run the startup recovery scan now: reclaim orphans (the orphan sensor launches their resume runs)."""
    out.progress("scanning for orphaned pipelines ...")
    try:
        settings = RecoverySettings.from_env()
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    stats = scan(store, PassPlan(limit=limit, trigger="cli"), settings=settings)
    if stats.error and stats.failed:
        raise click.ClickException(f"recovery scan failed: {stats.error}")
    data = {**stats.as_dict(), "reclaimed_pipelines": [r.pipeline_id for r in stats.reclaimed_pipelines],
            "given_up_pipelines": [{"id": g.pipeline_id, "reason": g.reason} for g in stats.given_up_pipelines]}

    def human() -> None:
        click.echo(f"found {stats.found} orphan(s): {stats.reclaimed} reclaimed (awaiting their resume run), "
                   f"{stats.given_up} given up, in {stats.duration_ms:.0f} ms")
        for r in stats.reclaimed_pipelines:
            click.echo(f"  - pipeline {r.pipeline_id} ({r.job_name}) resume #{r.resume_number}, "
                       f"reset nodes: {', '.join(r.reset_nodes) or '-'}")
        for g in stats.given_up_pipelines:
            click.echo(f"  - pipeline {g.pipeline_id} given up: {g.reason}")
        if stats.reclaimed:  # this command launches no run: say what does, or a reclaimed pipeline waits unseen
            click.echo("Their resume runs are launched by the orphan sensor (make_orphan_sensor) at its next tick, "
                       "so the Dagster daemon must be running: `dagster dev` runs one, or `dagster-daemon run`.")

    out.emit(data, human)


@main.command()
@click.option("--older-than", "older_than", type=Age(), required=True, metavar="DURATION",
              help="Delete pipelines that completed or failed longer ago than this (canceled ones are kept; one "
                   "with no end time, from an older version, by its last update): 12h, 90d, ...")
@click.option("--dry-run", is_flag=True, help="Count the pipelines that would go, by status; delete nothing.")
@click.option("--batch-size", type=IntRange(1, 10_000),
              help="Pipelines deleted per transaction [default: 200 on PostgreSQL, 50 on SQLite].")
@click.option("--deployment", metavar="NAME", type=DeploymentName(),
              help="Only the pipelines of this deployment (one Dagster instance).")
@command
def prune(store: CliStore, out: Output, older_than: float, dry_run: bool, batch_size: int | None,
          deployment: str | None) -> None:
    """Delete completed and failed pipelines older than --older-than with their nodes, item checkpoints, completed
    queue items, call journal, events, ledger rows and transitions, in small batches beside live work. Kept: canceled,
    running, waiting and orphaned pipelines, cost totals, the transitions the Prometheus counters count, and each
    completed queue item's dedupe key (so a rescan never does that work again)."""
    out.note_unknown_deployment(store, deployment)
    out.progress(f"{'counting' if dry_run else 'deleting'} pipelines finished more than {_seconds(older_than)} ago ...")

    def progress(result: PruneResult) -> None:
        if result.batches % 50 == 0:
            out.progress(f"  {result.pipelines} pipeline(s) deleted so far")

    result = store.reports.prune_finished_pipelines(older_than, batch_size=batch_size, deployment=deployment,
                                            dry_run=dry_run, progress=progress)

    # finished pipelines an older version left without an end time are aged by their last update: said apart,
    # since that age is a stand-in an operator may want to check before deleting them
    undated = (f"; {result.no_end_time} of them with no end time, aged by their last update"
               if result.no_end_time else "")

    def human() -> None:
        if dry_run:
            by_status = ", ".join(f"{n} {status}" for status, n in sorted(result.by_status.items()))
            click.echo(f"would delete {result.pipelines} pipeline(s){f' ({by_status})' if by_status else ''}"
                       f"{undated}; dry run: nothing was deleted")
            return
        rows = ", ".join(f"{table} {n}" for table, n in sorted(result.rows.items()) if n and table != "rx_pipelines")
        longest = f" (longest {result.longest_batch_seconds * 1000:.0f} ms)" if result.batches else ""
        compact = ", ".join(f"{table} {n}" for table, n in sorted(result.compacted.items()))
        click.echo(f"deleted {result.pipelines} pipeline(s) in {result.batches} batch(es){longest}{undated}"
                   + (f"; rows: {rows}" if rows else "")
                   + (f"; kept as dedupe records: {compact}" if compact else ""))

    out.emit(result.as_dict(), human)


@main.command("reset-stuck")
@click.option("--threshold", type=Duration(), default="10m", show_default=True,
              help="Processing items without a heartbeat deadline (legacy rows) started longer ago than this are "
                   "stuck; the others are stuck when their heartbeat deadline passed or their pipeline was reclaimed.")
@click.option("--queue", help="Only this queue.")
@click.option("--job-id", "item_id", type=ROW_ID, help="Show one item's status, then reset it if stuck.")
@click.option("--dry-run", is_flag=True, help="List what would be reset, change nothing.")
@command
def reset_stuck(store: CliStore, out: Output, threshold: float, queue: str | None, item_id: int | None,
                dry_run: bool) -> None:
    """Reset stuck queue items back to ready (manual recovery)."""
    if item_id is not None:
        item = store.queue.get_item(item_id)
        out.progress(f"item {item.id} ({item.queue}): {item.status}, worker {item.worker or '-'}, "
                     f"started {_when(item.started_at)}, attempts {item.attempts}/{item.max_attempts}")
    out.progress(f"checking for stuck items (threshold {_seconds(threshold)}) ...")
    stuck = store.queue.stale_items(queue=queue, older_than_seconds=threshold, item_id=item_id)
    reset = [] if dry_run else store.queue.reset_stale(queue=queue, older_than_seconds=threshold, item_id=item_id,
                                                 reason="reset-stuck command")
    data = {"dry_run": dry_run, "stuck": [_stuck(i) for i in stuck],
            "reset": [{"id": r.id, "new_status": r.new_status} for r in reset]}

    def human() -> None:
        if not stuck:
            click.echo("no stuck items found")
            return
        click.echo(f"found {len(stuck)} stuck item(s):")
        click.echo(tabulate([(i.id, i.queue, i.worker or "-", _when(i.started_at), i.attempts, i.stale_reason,
                              i.payload.get("name", "") if isinstance(i.payload, dict) else "") for i in stuck],
                            headers=["item", "queue", "worker", "started", "attempts", "stuck", "document"]))
        if dry_run:
            click.echo("dry run: nothing was changed")
        else:
            ready = sum(r.new_status == QueueStatus.READY for r in reset)
            click.echo(f"reset {len(reset)} stuck item(s): processing -> ready ({ready}), "
                       f"-> dead at max attempts ({len(reset) - ready})")

    out.emit(data, human)


@main.command("retry-dead")
@click.argument("item_ids", nargs=-1, type=ROW_ID)
@click.option("--all", "retry_all", is_flag=True, help="Retry every dead item.")
@click.option("--queue", help="With --all: only this queue.")
@command
def retry_dead(store: CliStore, out: Output, item_ids: tuple[int, ...], retry_all: bool,
               queue: str | None) -> None:
    """Put dead items back to ready with their attempts cleared (recorded as a transition)."""
    if bool(item_ids) == retry_all:
        raise click.UsageError("give item IDs or --all (not both)")
    retried = store.queue.retry_dead(None if retry_all else list(item_ids), queue=queue)
    out.emit({"retried": retried}, lambda: click.echo(f"retried {len(retried)} dead item(s): "
                                                       f"{', '.join(map(str, retried)) or '-'}"))


@main.command("redo-degraded")
@click.argument("pipeline_id", type=ROW_ID)
@click.option("--node", help="Only this node's degraded items.")
@command
def redo_degraded(store: CliStore, out: Output, pipeline_id: int, node: str | None) -> None:
    """Ask the provider again for the degraded items (fallback answers) of a completed pipeline.

    The pipeline is reopened awaiting a resume run, which the orphan sensor launches on its next
    tick; the resume run skips every other node and item.
    """
    try:
        grace = RecoverySettings.from_env().launch_grace_seconds
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    reopened = store.providers.reopen_degraded(pipeline_id, node, grace_seconds=grace)
    data = {"pipeline_id": pipeline_id, "nodes": list(reopened.nodes), "items": reopened.items,
            "resume_number": reopened.resume_number}

    def human() -> None:
        if not reopened.items:
            click.echo(f"pipeline {pipeline_id} has no degraded items; nothing to redo")
            return
        click.echo(f"pipeline {pipeline_id} ({reopened.job_name}) reopened as resume #{reopened.resume_number}: "
                   f"{reopened.items} degraded item(s) in {', '.join(reopened.nodes)}; the orphan sensor "
                   "launches the resume run on its next tick")

    out.emit(data, human)


@main.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until interrupted.")
@click.option("--kind", multiple=True, help="Only these kinds (repeatable).")
@click.option("--limit", type=IntRange(1, 10_000), default=50, show_default=True)
@click.option("--interval", type=PollInterval(), default="1", show_default=True,
              help="Seconds between polls with --follow.")
@command
def events(store: CliStore, out: Output, follow: bool, kind: tuple[str, ...], limit: int,
           interval: float) -> None:
    """Recovery events (the outbox), the newest --limit of them: recovered, stuck, item reset, item dead ..."""
    kinds = tuple(dict.fromkeys(kind)) or None
    if kinds and len(kinds) > MAX_KINDS:
        raise BadArgument(f"at most {MAX_KINDS} different --kind values, got {len(kinds)}")
    if follow:
        recent, cursor = store.reports.start_following(kinds=kinds, limit=limit)
    else:
        recent = store.reports.recent_events(kinds=kinds, limit=limit, newest=True)

    def show(rows: list[dict[str, Any]]) -> None:
        for e in rows:
            if out.json:
                click.echo(json.dumps(jsonable(e), sort_keys=True))
            else:
                target = f"pipeline {e['pipeline_id']}" if e["pipeline_id"] else (
                    f"item {e['queue_item_id']}" if e["queue_item_id"] else "")
                click.echo(f"{_when(e['created_at'])}  #{e['id']:<6} {e['kind']:<20} {target:<14} "
                           f"{json.dumps(jsonable(e['payload']), sort_keys=True)}")
            sys.stdout.flush()

    show(recent)
    while follow:
        try:
            time.sleep(interval)
            show(store.reports.follow_events(cursor, kinds=kinds))
        except KeyboardInterrupt:
            return


@main.group()
def metrics() -> None:
    """Prometheus metrics read from the application tables."""


@metrics.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=IntRange(0, 65535), default=9464, show_default=True,
              help="Port to listen on (0: any free port, printed at start).")
@command(checks_schema=False, serves=True)
def metrics_serve(store: CliStore, out: Output, host: str, port: int) -> None:
    """Serve /metrics for Prometheus; each scrape reads the tables, nothing is kept between scrapes.

    It serves whether or not the database answers: a scrape it cannot read says recovery_database_up 0."""
    try:
        from recovery_ext._observe.exporter import MetricsServer
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "prometheus_client":
            raise
        raise click.ClickException(f"the metrics exporter needs prometheus-client: {install_hint('metrics')}") from None
    try:
        server = MetricsServer(store, host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    url = f"http://{host}:{server.port}/metrics"
    out.emit({"url": url, "host": host, "port": server.port}, lambda: click.echo(f"serving metrics on {url}"))
    sys.stdout.flush()

    def look_at_the_database() -> None:
        # Serving already: the database is read once, within a scrape's timeouts, for the operator's sake; a
        # newer release's schema ends the exporter (MigrationError), a database down or locked does not.
        try:
            server.check_database()
        except MigrationError:
            raise
        except RecoveryError as exc:
            click.echo(f"warning: cannot read the database now ({redact(exc)}); scrapes report "
                       "recovery_database_up 0 until it can", err=True)

    server.serve_until_stopped(look_at_the_database)


@main.command()
@click.argument("pipeline_id", type=ROW_ID)
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to this file (one self-contained HTML page). Optional with --json.")
@command
def report(store: CliStore, out: Output, pipeline_id: int, html_path: Path | None) -> None:
    """A pipeline across its runs: a timeline of runs, faults, reclaims, waits and the items each run did.

    --html FILE writes the page; --json prints the timeline as data (with or without --html).
    """
    from recovery_ext._observe.timeline import build_timeline

    if html_path is None and not out.json:
        raise BadArgument("give --html FILE (the page), --json (the timeline as data), or both")
    timeline = build_timeline(store.reports.pipeline_history(pipeline_id))
    if html_path is None:
        out.emit(timeline.as_dict(), lambda: None)
        return
    _write_report_page(timeline, html_path)
    data = {"file": str(html_path), **timeline.as_dict()}
    out.emit(data, lambda: click.echo(
        f"wrote {html_path}: pipeline {pipeline_id}, {len(timeline.runs)} run(s), "
        f"{sum(r.items_done for r in timeline.runs)} item(s)"))


def _write_report_page(timeline: Timeline, html_path: Path) -> None:
    from recovery_ext._observe.report import render_html

    page = render_html(timeline)
    # Written beside the target and renamed over it: a failed write never leaves half a report.
    partial = html_path.with_name(f".{html_path.name}.partial")
    try:
        partial.write_text(page, encoding="utf-8")
        partial.replace(html_path)
    finally:
        partial.unlink(missing_ok=True)


def _add_plugin_commands(group: click.Group) -> None:
    """Commands that other installed packages add (entry point group ``recovery_ext.commands``).

    The library knows none of them by name: the demo pipelines add ``demo`` this way.
    """
    for entry in entry_points(group="recovery_ext.commands"):
        if entry.name in group.commands:
            continue
        try:
            group.add_command(entry.load(), entry.name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the operator CLI down
            click.echo(f"warning: command {entry.name!r} from {entry.value} is unavailable: {redact(exc)}", err=True)


_add_plugin_commands(main)


if __name__ == "__main__":
    main()
