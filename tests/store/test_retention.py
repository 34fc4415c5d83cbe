"""Retention: ``prune_finished_pipelines`` and ``recovery-ext prune`` on SQLite and PostgreSQL.

Pipelines are made through the store's own calls (checkpoints, ledger rows, journal, a claimed queue item,
events) and their end moved back in time with one UPDATE, so a cut-off of days needs no waiting.
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import numpy
import pytest
from helpers import expire, reclaim
from sqlalchemy import delete, func, inspect, select, update

from recovery_ext._store.models import SpendCaps
from recovery_ext import ConfigurationError, RecoveryResource
from recovery_ext._recovery import protocol as schedule
from recovery_ext._recovery.protocol import LaunchNothing, RecoveryProtocol
from recovery_ext._recovery.protocol import RecoverySettings
from recovery_ext._store.models import ProviderLimits
from recovery_ext._store.models import ItemCheckpoint, PassPlan, ProviderCall, Scope
from recovery_ext._store.observability import COUNTED_TRANSITION_EVENTS
from recovery_ext._store.retention import PRUNE_STEPS, _prunable, kept_on_purpose
from recovery_ext._store.schema import deleted_pipelines, pipelines, transitions
from recovery_ext._store.retention import PRUNABLE_STATUSES
from recovery_ext._store.store import RecoveryStore

DAY = 86400.0
PIPELINE_COLUMNS = ("pipeline_id", "holder_pipeline_id")


def history(store: RecoveryStore, run: str, *, ending: str = "complete", items: int = 3, ago_days: float = 100.0):
    """A pipeline with a row in every table of its history, ended by ``ending`` ``ago_days`` ago (``None``: live)."""
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner=run, origin_run_id=run, params={})
    store.pipelines.start_node(own, "a")
    for i in range(items):
        spent = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=10, tokens_out=5, cost=0.5,
                             pipeline_id=own.pipeline_id, node_name="a", item_key=f"k{i}", run_id=run, epoch=own.epoch)
        store.providers.record_provider_calls([spent])
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(f"k{i}", {"n": i}, calls=(spent,)))
    journaled = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", pipeline_id=own.pipeline_id,
                             node_name="a", item_key="j", run_id=run, epoch=own.epoch)
    store.providers.journal_begin(own, journaled, call_key="c1")
    store.providers.journal_answer(own, journaled, call_key="c1", answer="kept answer")
    batch_call = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", pipeline_id=own.pipeline_id,
                              node_name="a", run_id=run, epoch=own.epoch)
    store.pipelines.job_submitting(
        own, "a", token=f"{run}-t", provider="openai", items=["k0"], attempt=1, call=batch_call
    )
    store.pipelines.job_finished(own, "a", f"{run}-t", "collected")
    store.queue.enqueue("docs", [{"run": run}], dedupe_keys=[f"{run}-doc"], own=own)
    [item] = store.queue.claim("docs", run, own=own)
    store.queue.complete_item(item, {"ok": True})
    store.record_event("note", {"run": run}, pipeline_id=own.pipeline_id)
    # its spend cap, holding a reservation its process never settled (a kill)
    capped = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=1000))
    assert store.providers.spend_reserve(own, capped, tokens=10).granted
    assert store.providers.budget_reserve("http://127.0.0.1:9/v1", None, tokens=1, own=own,
                                          limits=ProviderLimits(requests_per_minute=1000)).granted
    if ending == "complete":
        store.pipelines.complete_node(own, "a")
        store.pipelines.complete_run(own)
    elif ending == "fail":
        store.pipelines.fail_run(own, "the step failed for good")
    elif ending == "cancel":
        store.pipelines.cancel_run(own, "canceled by its user")
    if ending is not None and ago_days:
        ended_ago(store, own.pipeline_id, ago_days)
    return own


def newest(store: RecoveryStore, run: str = "newest"):
    """A running pipeline newer than the others: the newest pipeline is never pruned (its id stays taken)."""
    return store.pipelines.create_pipeline("job", ["a"], owner=run, origin_run_id=run)


def ended_ago(store: RecoveryStore, pipeline_id: int, days: float) -> None:
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id)
                     .values(completed_at=store.dialect.now_plus(-days * DAY)))


def without_end_time(store: RecoveryStore, pipeline_id: int, days: float) -> None:
    """As an older version left a finished pipeline: no ``completed_at``, last updated ``days`` ago."""
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == pipeline_id)
                     .values(completed_at=None, updated_at=store.dialect.now_plus(-days * DAY)))


def rows_of(store: RecoveryStore, pipeline_ids) -> dict[str, int]:
    """Rows of every table that points at one of ``pipeline_ids`` (and the pipelines themselves), but the
    aggregates a prune keeps on purpose (a pipeline's cost totals outlive its detail)."""
    ids = list(pipeline_ids)
    found = {}
    with store.read() as conn:
        for table in store_tables(store):
            if kept_on_purpose(table.name):
                continue
            for column in PIPELINE_COLUMNS:
                if column in table.c:
                    found[f"{table.name}.{column}"] = conn.scalar(
                        select(func.count()).select_from(table).where(table.c[column].in_(ids)))
        found["rx_pipelines"] = conn.scalar(select(func.count()).where(pipelines.c.id.in_(ids)))
    return found


def store_tables(store: RecoveryStore):
    from sqlalchemy import MetaData

    meta = MetaData()
    meta.reflect(store.engine)
    return [t for name, t in sorted(meta.tables.items()) if name.startswith("rx_")]


def counters(store: RecoveryStore):
    snap = store.reports.metrics_snapshot()
    return snap.reclaims, snap.resume_runs, snap.given_up


def test_prune_deletes_the_whole_history_of_old_finished_pipelines_and_only_theirs(store):
    old = [history(store, f"old-{ending}", ending=ending) for ending in ("complete", "fail")]
    # canceled: its figures are not in the roll-ups of finished work (the cost counters read it live), so it stays
    canceled = history(store, "old-cancel", ending="cancel")
    before_canceled = rows_of(store, [canceled.pipeline_id])
    recent = history(store, "recent", ending="complete", ago_days=0.5)
    before_recent = rows_of(store, [recent.pipeline_id])
    # three checkpointed calls, a journaled one and a batch job's
    assert before_recent["rx_node_items.pipeline_id"] == 3 and before_recent["rx_provider_calls.pipeline_id"] == 5
    assert all(rows_of(store, [old[1].pipeline_id]).values())  # the failed one keeps its journal
    costs_before = store.reports.metrics_snapshot().provider_calls
    ledger_counters_before = store.reports.metrics_snapshot().provider_costs  # spent, saved, wasted, replayed

    result = store.reports.prune_finished_pipelines(DAY)

    assert (result.pipelines, result.done) == (2, True)
    assert result.rows["rx_node_items"] == 6 and result.rows["rx_provider_calls"] == 10
    assert result.rows["rx_call_journal"] == 1  # the failed one's
    assert result.rows["rx_queue_items"] == 0 and result.compacted["rx_queue_items"] == 2  # their dedupe stays
    assert result.compacted["rx_rate_reservations"] == 2  # detached: each goes when its window has passed
    gone = rows_of(store, [o.pipeline_id for o in old])
    assert gone == dict.fromkeys(gone, 0), gone
    assert rows_of(store, [recent.pipeline_id]) == before_recent
    assert rows_of(store, [canceled.pipeline_id]) == before_canceled
    assert store.pipelines.get_pipeline(recent.pipeline_id).status == "completed"
    after = store.reports.metrics_snapshot()
    assert after.provider_calls == costs_before  # the cost counters read the roll-ups, kept: none goes down
    assert after.provider_costs == ledger_counters_before
    # a prune deletes the rows before their pipeline: nothing is left pointing at it, and its delete notes nothing
    assert store.reports.dangling_rows() == []
    with store.read() as conn:
        assert conn.scalar(select(func.count()).select_from(deleted_pipelines)) == 0


def test_the_transitions_prometheus_counts_stay_so_no_counter_goes_backwards(store):
    own = history(store, "reclaimed", ending=None)
    expire(store, own.pipeline_id)
    [reclaimed], _ = reclaim(store, PassPlan(limit=1, launching=True))
    placeholder = store.pipelines.get_pipeline(own.pipeline_id).owner
    resumed = store.pipelines.take_over(own.pipeline_id, "resume-run", owner_dead=[placeholder], heartbeat_timeout=60)
    store.pipelines.fail_run(resumed, "failed again")
    given_up = history(store, "given-up", ending=None)
    with store.write() as conn:  # hopeless: out of resumes
        conn.execute(update(pipelines).where(pipelines.c.id == given_up.pipeline_id).values(max_resumes=0))
    expire(store, given_up.pipeline_id)
    reclaim(store, PassPlan(limit=0))  # the pass gives up the hopeless ones
    for pipeline_id in (own.pipeline_id, given_up.pipeline_id):
        ended_ago(store, pipeline_id, 100)
    newest(store)
    before = counters(store)
    assert before[0] and before[1] and before[2] == 1

    assert store.reports.prune_finished_pipelines(DAY).pipelines == 2

    assert counters(store) == before
    with store.read() as conn:
        kept = conn.execute(select(transitions.c.entity_type, transitions.c.event)
                            .where(transitions.c.pipeline_id.in_([own.pipeline_id, given_up.pipeline_id]))).all()
    assert kept and {(e, ev) for e, ev in kept} <= {("pipeline", ev) for ev in COUNTED_TRANSITION_EVENTS}


def test_live_and_resumable_pipelines_are_never_touched_however_old(store):
    running = history(store, "running", ending=None)
    waiting = history(store, "waiting", ending=None)
    store.providers.set_waiting(waiting, 3600, "provider outage")
    orphaned = history(store, "orphaned", ending=None)
    expire(store, orphaned.pipeline_id)
    awaiting = history(store, "awaiting", ending=None)
    expire(store, awaiting.pipeline_id)
    reclaim(store, PassPlan(limit=10, launching=False))  # reclaimed, awaiting a resume run (the CLI's scan)
    orphaned_again = history(store, "orphaned-again", ending=None)
    pending = history(store, "pending", ending=None)
    live = [running, waiting, orphaned, awaiting, orphaned_again, pending]
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == pending.pipeline_id).values(status="pending"))
        # As old as can be: created, updated and even (a stray value) ended long ago; only the status counts.
        long_ago = store.dialect.now_plus(-3650 * DAY)
        conn.execute(update(pipelines).where(pipelines.c.id.in_([o.pipeline_id for o in live]))
                     .values(created_at=long_ago, updated_at=long_ago, completed_at=long_ago))
    expire(store, orphaned_again.pipeline_id)
    statuses = {p.id: p.status for p in store.reports.list_pipelines(limit=100)}
    assert {statuses[o.pipeline_id] for o in live} == {"running", "pending"}
    before = rows_of(store, [o.pipeline_id for o in live])

    result = store.reports.prune_finished_pipelines(3600)

    assert (result.pipelines, result.rows) == (0, {})
    assert rows_of(store, [o.pipeline_id for o in live]) == before
    assert {p.id: p.status for p in store.reports.list_pipelines(limit=100)} == statuses


def test_a_dead_or_failed_queue_item_outlives_its_pruned_pipeline_so_retry_dead_can_revive_it(store):
    own = history(store, "dead-docs", ending=None)
    store.queue.enqueue("scans", [{"d": 1}, {"d": 2}], dedupe_keys=["out-of-attempts", "permanent"], own=own,
                  max_attempts=1)
    items = {i.dedupe_key: i for i in store.queue.claim("scans", "w", limit=2, own=own)}
    assert store.queue.fail_item(items["out-of-attempts"], "timed out") == "dead"
    assert store.queue.fail_item(items["permanent"], "not a PDF", retryable=False) == "failed"
    store.pipelines.complete_node(own, "a")
    store.pipelines.complete_run(own)
    ended_ago(store, own.pipeline_id, 100)
    newest(store)

    result = store.reports.prune_finished_pipelines(DAY)

    assert result.pipelines == 1 and result.compacted["rx_queue_items"] == 1  # only its completed item is compacted
    assert {i.dedupe_key: i.status for i in store.queue.list_items("scans")} == {"out-of-attempts": "dead",
                                                                           "permanent": "failed"}
    assert store.queue.retry_dead(queue="scans") == [items["out-of-attempts"].id]
    assert store.queue.get_item(items["out-of-attempts"].id).status == "ready"


def test_a_pruned_pipelines_completed_queue_items_keep_their_dedupe_so_a_rescan_adds_nothing(store):
    """Retention never makes done work look undone: a folder rescan enqueues the same documents again, and every
    one a pruned pipeline completed is found done, not processed and paid for a second time."""
    old = history(store, "old", ending=None)  # completed its document "old-doc"
    keyless = store.queue.enqueue("docs", [{"no": "key"}], own=old)  # completed without a dedupe key: nothing to keep
    [item] = store.queue.claim("docs", "w", own=old)
    store.queue.complete_item(item, {"ok": True})
    store.pipelines.complete_node(old, "a")
    store.pipelines.complete_run(old)
    ended_ago(store, old.pipeline_id, 100)
    newest(store)

    result = store.reports.prune_finished_pipelines(DAY)

    assert result.pipelines == 1 and result.rows["rx_queue_items"] == 1 and result.compacted["rx_queue_items"] == 1
    assert store.queue.enqueue("docs", [{"run": "rescan"}], dedupe_keys=["old-doc"]) == []  # known: not added
    [kept] = store.queue.list_items("docs")
    assert (kept.dedupe_key, kept.status, kept.attempts) == ("old-doc", "completed", 1)
    assert store.queue.item_ids("docs", ["old-doc"]) == [kept.id] and keyless[0] != kept.id
    # compact: its payload, result and holder (a pipeline that is gone) are not kept
    assert (kept.payload, kept.result, kept.holder_pipeline_id, kept.worker) == ({}, None, None, None)
    assert rows_of(store, [old.pipeline_id]) == dict.fromkeys(rows_of(store, [old.pipeline_id]), 0)
    assert {(r["queue"], r["status"]): r["count"] for r in store.reports.queue_summary()} == {("docs", "completed"): 1}
    assert store.reports.prune_finished_pipelines(DAY).rows == {}  # a second prune finds nothing left to do


def test_prune_help_says_what_it_deletes_and_what_it_keeps(cli):
    text = " ".join(cli("prune", "--help").output.split())
    assert "Delete pipelines that completed or failed longer ago than this" in text
    assert "(completed, failed, canceled)" not in text and "Kept: canceled, running, waiting and orphaned" in text
    described = RecoveryResource.model_fields["finished_pipeline_retention_seconds"].description
    assert "Completed and failed pipelines" in described and "canceled ones are kept" in described


def test_batches_stop_at_each_boundary_and_a_second_run_finds_nothing(store):
    old = [history(store, f"old-{i}", items=1) for i in range(5)]
    newest(store)
    seen: list[int] = []

    first = store.reports.prune_finished_pipelines(DAY, batch_size=2, progress=lambda r: seen.append(r.pipelines))

    assert (first.pipelines, first.batches, first.done, seen) == (5, 3, True, [2, 4, 5])
    assert rows_of(store, [o.pipeline_id for o in old])["rx_pipelines"] == 0
    again = store.reports.prune_finished_pipelines(DAY, batch_size=2)
    assert (again.pipelines, again.batches, again.done, again.rows) == (0, 0, True, {})

    exact = [history(store, f"exact-{i}", items=1) for i in range(4)]  # a last batch exactly full
    newest(store, "newest-again")
    limited = store.reports.prune_finished_pipelines(DAY, batch_size=2, max_batches=1)
    assert (limited.pipelines, limited.done) == (2, False)
    rest = store.reports.prune_finished_pipelines(DAY, batch_size=2)
    assert (rest.pipelines, rest.batches, rest.done) == (2, 1, True)
    assert rows_of(store, [o.pipeline_id for o in exact])["rx_pipelines"] == 0


def test_a_pipeline_that_finishes_or_is_taken_over_during_the_prune_is_kept(store):
    for i in range(4):
        history(store, f"old-{i}", items=1)
    finishing = history(store, "finishing", ending=None)
    reexecuted = history(store, "reexecuted", ending="fail")
    with store.write() as conn:  # both older than the cut-off in every column but the end they are about to get
        conn.execute(update(pipelines).where(pipelines.c.id == finishing.pipeline_id)
                     .values(created_at=store.dialect.now_plus(-400 * DAY)))

    def meanwhile(result):
        if result.batches == 1:
            store.pipelines.complete_node(finishing, "a")
            store.pipelines.complete_run(finishing)
            store.pipelines.take_over(reexecuted.pipeline_id, "reexecution", heartbeat_timeout=60)

    result = store.reports.prune_finished_pipelines(DAY, batch_size=2, progress=meanwhile)

    assert (result.pipelines, result.done) == (4, True)
    assert store.pipelines.get_pipeline(finishing.pipeline_id).status == "completed"
    assert store.pipelines.get_pipeline(reexecuted.pipeline_id).status == "running"
    assert store.pipelines.completed_items(reexecuted.pipeline_id, "a") == {
        "k0": {"n": 0},
        "k1": {"n": 1},
        "k2": {"n": 2},
    }


def test_dry_run_counts_by_status_and_deployment_scopes(store):
    history(store, "done", ending="complete")
    history(store, "failed", ending="fail")
    other = store.pipelines.create_pipeline(
        "job", ["a"], owner="elsewhere", origin_run_id="elsewhere", deployment="other"
    )
    store.pipelines.fail_run(other, "x")
    ended_ago(store, other.pipeline_id, 100)
    newest(store)
    before = rows_of(store, range(1, 10))

    dry = store.reports.prune_finished_pipelines(DAY, dry_run=True)

    assert (dry.pipelines, dry.by_status, dry.rows) == (3, {"completed": 1, "failed": 2}, {})
    assert rows_of(store, range(1, 10)) == before
    assert store.reports.prune_finished_pipelines(DAY, deployment="other").pipelines == 1
    assert store.reports.prune_finished_pipelines(DAY, dry_run=True).by_status == {"completed": 1, "failed": 1}


def test_a_finished_pipeline_without_an_end_time_is_aged_by_its_last_update_and_counted_apart(store):
    dated = history(store, "dated", ending="complete")
    undated = [history(store, run, ending=ending) for run, ending in (("undated-ok", "complete"),
                                                                      ("undated-failed", "fail"))]
    recent = history(store, "undated-recent", ending="complete")
    canceled = history(store, "undated-canceled", ending="cancel")
    running = history(store, "undated-running", ending=None)
    for own in undated:
        without_end_time(store, own.pipeline_id, 100)
    without_end_time(store, recent.pipeline_id, 0.1)  # updated since the cut-off: not old enough yet
    for own in (canceled, running):  # never prunable, whatever their age
        without_end_time(store, own.pipeline_id, 100)
    newest(store)

    dry = store.reports.prune_finished_pipelines(DAY, dry_run=True)
    assert (dry.pipelines, dry.by_status, dry.no_end_time) == (3, {"completed": 2, "failed": 1}, 2)
    done = store.reports.prune_finished_pipelines(DAY, batch_size=1)
    assert (done.pipelines, done.batches, done.no_end_time, done.done) == (3, 3, 2, True)
    gone = [dated.pipeline_id, *(own.pipeline_id for own in undated)]
    assert not any(rows_of(store, gone).values()), rows_of(store, gone)
    kept = [recent.pipeline_id, canceled.pipeline_id, running.pipeline_id]
    assert rows_of(store, kept)["rx_pipelines"] == 3
    assert store.reports.prune_finished_pipelines(DAY, dry_run=True).as_dict()["no_end_time"] == 0


def test_cli_prune_says_how_many_pipelines_had_no_end_time(cli, store):
    history(store, "dated", ending="complete")
    undated = history(store, "undated", ending="fail")
    without_end_time(store, undated.pipeline_id, 100)
    newest(store)
    dry = cli("prune", "--older-than", "90d", "--dry-run").stdout
    assert "would delete 2 pipeline(s) (1 completed, 1 failed); 1 of them with no end time" in dry
    assert "deleted 2 pipeline(s) in 1 batch(es)" in cli("prune", "--older-than", "90d").stdout
    assert rows_of(store, [undated.pipeline_id])["rx_pipelines"] == 0


def test_every_table_that_points_at_a_pipeline_is_pruned_or_kept_on_purpose(store):
    """A new table with a pipeline column must be added to PRUNE_STEPS or be an aggregate kept on purpose; an
    aggregate must not disappear with its pipeline through an ON DELETE CASCADE."""
    pruned = {step.table.name for step in PRUNE_STEPS}
    assert not {name for name in pruned if kept_on_purpose(name)}
    inspector = inspect(store.engine)
    for table in store_tables(store):
        if table.name == "rx_pipelines":
            continue
        points = [c for c in PIPELINE_COLUMNS if c in table.c]
        if kept_on_purpose(table.name):
            for fk in inspector.get_foreign_keys(table.name):
                assert not (fk["referred_table"] == "rx_pipelines"
                            and (fk.get("options") or {}).get("ondelete", "").upper() == "CASCADE"), table.name
        elif points:
            assert table.name in pruned, f"{table.name} points at pipelines: prune it or keep it on purpose"


def test_postgres_skips_a_pipeline_another_transaction_holds_instead_of_waiting(pg_url):
    """PostgreSQL only (SQLite has one writer, no row locks): a pipeline another transaction holds (a re-execution
    taking it over) is skipped, not waited
    for; the next prune takes it."""
    store = RecoveryStore(pg_url)
    store.migrate()
    try:
        held = history(store, "held", ending="fail")
        free = history(store, "free", ending="fail")
        newest(store)
        with store.write() as conn:
            conn.execute(select(pipelines.c.id).where(pipelines.c.id == held.pipeline_id).with_for_update())
            result = store.reports.prune_finished_pipelines(DAY)
            assert (result.pipelines, result.done) == (1, True)
        assert store.pipelines.get_pipeline(held.pipeline_id).status == "failed"
        assert rows_of(store, [free.pipeline_id])["rx_pipelines"] == 0
        assert store.reports.prune_finished_pipelines(DAY).pipelines == 1
    finally:
        store.close()


def test_cli_prune_dry_run_then_prune_then_nothing_left(cli, store):
    old = history(store, "old", ending="complete")
    recent = history(store, "recent", ending="complete", ago_days=0.1)

    dry = cli("prune", "--older-than", "90d", "--dry-run")
    assert "would delete 1 pipeline(s) (1 completed); dry run: nothing was deleted" in dry.stdout
    assert store.pipelines.get_pipeline(old.pipeline_id).status == "completed"
    done = json.loads(cli("--json", "prune", "--older-than", "12h", "--batch-size", "1").stdout)
    assert (done["pipelines"], done["batches"], done["done"], done["rows"]["rx_node_items"]) == (1, 1, True, 3)
    assert rows_of(store, [old.pipeline_id])["rx_pipelines"] == 0
    assert store.pipelines.get_pipeline(recent.pipeline_id).status == "completed"
    assert "deleted 0 pipeline(s) in 0 batch(es)" in cli("prune", "--older-than", "3h").stdout


@pytest.mark.parametrize("args, message", [
    ([], "Missing option '--older-than'"),
    (["--older-than", "soon"], "not a duration: 'soon'"),
    (["--older-than", "-3d"], "a duration must be positive"),
    (["--older-than", "nan"], "a duration must be a finite number"),
    (["--older-than", "30m"], "must be between 3600 and"),
    (["--older-than", "1e300d"], "must be between 3600 and"),
    (["--older-than", "90d", "--batch-size", "0"], "0 is not in the range 1<=x<=10000"),
])
def test_cli_prune_refuses_bad_input_with_one_line_and_exit_2(cli, store, args, message):
    history(store, "old", ending="complete")
    newest(store)
    result = cli("prune", *args, code=2)
    assert message in result.output and "Traceback" not in result.output
    assert store.reports.prune_finished_pipelines(DAY, dry_run=True).pipelines == 1  # nothing was deleted


def test_the_orphan_sensor_prunes_at_most_hourly_and_a_pass_goes_on_while_pipelines_are_left(store, monkeypatch):
    monkeypatch.setattr(schedule, "TICK_BUDGET_SECONDS", 0.0)  # one batch per tick
    now = [0.0]
    protocol = RecoveryProtocol(Scope(), clock=lambda: now[0])
    protocol.retention = schedule.RetentionSchedule(lambda: now[0], batch_size=2)

    def tick(retention=DAY):
        outcome = protocol.tick(store, LaunchNothing(), RecoverySettings(), pipeline_retention_seconds=retention)
        assert outcome.stats.error is None
        return store.reports.prune_finished_pipelines(DAY, dry_run=True).pipelines

    for i in range(3):
        history(store, f"old-{i}", items=1)
    newest(store)
    assert tick(retention=None) == 3  # retention off: kept for ever
    assert tick() == 1  # a pass: one batch this tick
    now[0] += 30
    assert tick() == 0  # the pass goes on at the next tick and ends
    history(store, "later", items=1)
    newest(store, "newest-again")
    now[0] += 60
    assert tick() == 1  # the next pass waits for the hour
    now[0] += 3600
    assert tick() == 0


@pytest.mark.parametrize("seconds", [3600.0, float("nan"), -1.0, 11 * 366 * DAY])
def test_the_retention_setting_is_off_by_default_and_bounded(seconds):
    assert RecoveryResource().finished_pipeline_retention_seconds is None
    kept = RecoveryResource(finished_pipeline_retention_seconds=90 * DAY)
    assert kept.finished_pipeline_retention_seconds == 90 * DAY
    with pytest.raises(ValueError, match="finished_pipeline_retention_seconds must be"):
        RecoveryResource(finished_pipeline_retention_seconds=seconds)


def test_the_newest_pipeline_is_kept_so_sqlite_never_hands_its_id_out_again(store):
    old = history(store, "old", ending="fail")
    assert store.reports.prune_finished_pipelines(DAY).pipelines == 0  # the newest: kept, with its history
    assert rows_of(store, [old.pipeline_id])["rx_node_items.pipeline_id"] == 3
    later = newest(store)
    assert store.reports.prune_finished_pipelines(DAY).pipelines == 1
    again = newest(store, "after-the-prune")
    assert again.pipeline_id > later.pipeline_id > old.pipeline_id


def test_every_prune_statement_reads_through_an_index(store):
    """Each batch's candidate query and each table's DELETE is an indexed range on both databases: no full scan
    (PostgreSQL with sequential scans priced out, so the plan shows what an index can serve on any table size)."""
    cutoff = store.dialect.now_plus(-DAY)
    statements = [select(pipelines.c.id).where(*_prunable(cutoff, status, "d", 7, ended)).limit(200)
                  for status in PRUNABLE_STATUSES for ended in (True, False)]
    statements += [delete(step.table).where(step.rows_of([1, 2, 3])) for step in PRUNE_STEPS]
    with store.write() as conn:
        if store.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        for statement in statements:
            sql = str(statement.compile(store.engine, compile_kwargs={"literal_binds": True}))
            explain = "EXPLAIN QUERY PLAN " if store.dialect.name == "sqlite" else "EXPLAIN "
            plan = "\n".join(" ".join(map(str, row)) for row in conn.exec_driver_sql(explain + sql))
            assert "Seq Scan" not in plan and " SCAN " not in f" {plan}", f"{sql}\n{plan}"


def test_the_pipelines_without_an_end_time_are_their_own_index_range_not_the_whole_status(store):
    """The fallback's candidates are found by ``completed_at IS NULL`` on the status index's second column, so a
    batch never reads the completed pipelines that ended after the cut-off to find the few old undated ones."""
    cutoff = store.dialect.now_plus(-DAY)
    with store.write() as conn:
        if store.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        for status in PRUNABLE_STATUSES:
            statement = select(pipelines.c.id).where(*_prunable(cutoff, status, None, 7, ended=False)).limit(200)
            sql = str(statement.compile(store.engine, compile_kwargs={"literal_binds": True}))
            if store.dialect.name == "sqlite":
                plan = " ".join(" ".join(map(str, row)) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
                assert "INDEX rx_pipelines_finished (status=? AND completed_at=?)" in plan, plan
            else:
                plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + sql))
                assert "Index Cond: ((status = " in plan and "AND (completed_at IS NULL))" in plan, plan


@pytest.mark.parametrize("days", [Decimal("50"), Fraction(101, 2), numpy.int64(50), numpy.float64(50.5)], ids=repr)
def test_a_retention_age_of_any_real_number_is_taken(store, days):
    """A review found it: the age check refused a Decimal (and numpy's integers) the store used to take. Any real
    number passes, as a float."""
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.fail_run(own, "boom")
    ended_ago(store, own.pipeline_id, 100)
    newest(store)
    assert store.reports.prune_finished_pipelines(days * 3 * int(DAY), dry_run=True).by_status == {}  # too young
    assert store.reports.prune_finished_pipelines(days * int(DAY), dry_run=True).by_status == {"failed": 1}
    assert store.reports.prune_events(days * int(DAY)) == 0


@pytest.mark.parametrize("older_than", [Decimal("NaN"), Decimal("sNaN"), Decimal("-1"), Decimal("1e400"),
                                        numpy.float64("nan"), numpy.int64(-1), numpy.True_], ids=repr)
def test_a_number_type_that_is_no_age_is_refused(store, older_than):
    with pytest.raises(ConfigurationError, match="older_than_seconds must be"):
        store.reports.prune_finished_pipelines(older_than, dry_run=True)


@pytest.mark.parametrize("older_than", [-5, float("nan"), float("inf"), "1d", True])
def test_a_retention_that_is_no_age_is_refused_by_the_store_as_by_the_cli(store, older_than):
    """A hostile trial: the CLI refused them, the library took them (-5 a cut-off in the future: every finished
    pipeline, and event, went; NaN silently nothing). Refused now, nothing deleted."""
    with pytest.raises(ConfigurationError, match="older_than_seconds must be"):
        store.reports.prune_finished_pipelines(older_than, dry_run=True)
    with pytest.raises(ConfigurationError, match="older_than_seconds must be"):
        store.reports.prune_events(older_than)
