"""Saved by resume (migration 0022), on SQLite and PostgreSQL: only the paid calls a resume did not make again,
in a node it went through again; a node that finished before the crash was never at risk and saves nothing.
The cost report, a run's call fates (`report`) and the roll-ups of finished pipelines (metrics, `status`)
agree on it."""

from __future__ import annotations

import json
from dataclasses import replace

from click.testing import CliRunner

from helpers import expire, reclaim
from recovery_ext._cli import main
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import ItemCheckpoint, PassPlan, ProviderCall

ENDPOINT = "http://127.0.0.1:9/v1"


def call(own, node: str, item: str, cost: float, **kw) -> ProviderCall:
    return ProviderCall(endpoint=ENDPOINT, model="m", pipeline_id=own.pipeline_id, node_name=node, item_key=item,
                        run_id=own.owner, epoch=own.epoch, tokens_in=10, tokens_out=1, latency_seconds=0.1,
                        cost=cost, **kw)


def crash_in_node_b(store):
    """run-1 finishes node a (two paid items), checkpoints b/k0 (paid), journals the answer of b/k1 (paid, its
    item not checkpointed yet) and dies; run-2 takes the pipeline over. Returns both ownerships."""
    first = store.pipelines.create_pipeline("job", ["a", "b"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(first, "a")
    store.pipelines.checkpoint_items(first, "a", [ItemCheckpoint(k, k, calls=(call(first, "a", k, 1.0),))
                                                  for k in ("k0", "k1")])
    store.pipelines.complete_node(first, "a")
    store.pipelines.start_node(first, "b")
    store.pipelines.checkpoint_item(first, "b", ItemCheckpoint("k0", 0, calls=(call(first, "b", "k0", 2.0),)))
    journaled = call(first, "b", "k1", 0.0, outcome=IN_FLIGHT)
    assert store.providers.journal_begin(first, journaled, call_key="fp#1") is None
    store.providers.journal_answer(first, replace(journaled, outcome="ok", cost=3.0), call_key="fp#1",
                                   answer='"answer"')
    expire(store, first.pipeline_id)
    reclaim(store, PassPlan(limit=1))
    second = store.pipelines.attach(first.pipeline_id, "run-2", resume_number=1)
    return first, second


def resume_through_node_b(store, second) -> None:
    """What the resume run does: node a is recorded finished (skipped whole), node b starts again; b/k0 is
    skipped (checkpointed), b/k1's answer is replayed from the journal, b/k2 is paid for."""
    (_, a, started_a) = store.pipelines.begin_node("run-2", "a")
    assert (a.status, started_a) == ("completed", False)
    (_, _, started_b) = store.pipelines.begin_node("run-2", "b")
    assert started_b
    hit = store.providers.journal_begin(second, call(second, "b", "k1", 0.0, outcome=IN_FLIGHT), call_key="fp#1")
    assert hit is not None and hit.answer == '"answer"'
    store.pipelines.checkpoint_item(second, "b", ItemCheckpoint("k1", 1, calls=(hit.call,)))
    store.pipelines.checkpoint_item(second, "b", ItemCheckpoint("k2", 2, calls=(call(second, "b", "k2", 4.0),)))


def saved(figures) -> tuple:
    return figures.calls, figures.saved_calls, figures.saved_cost, figures.replayed_calls


def test_a_node_finished_before_the_crash_saves_nothing_and_a_re_entered_nodes_checkpoints_do(store):
    first, second = crash_in_node_b(store)
    nodes = store.reports.provider_costs(first.pipeline_id).nodes[first.pipeline_id]
    # taken over, but no resume has gone through either node yet: nothing saved so far
    assert (saved(nodes["a"]), saved(nodes["b"])) == ((2, 0, 0.0, 0), (2, 0, 0.0, 0))

    resume_through_node_b(store, second)
    report = store.reports.provider_costs(first.pipeline_id)
    nodes = report.nodes[first.pipeline_id]
    assert saved(nodes["a"]) == (2, 0, 0.0, 0)  # finished before the crash, skipped whole: never at risk
    assert saved(nodes["b"]) == (3, 2, 5.0, 1)  # b/k0 checkpointed, b/k1 replayed from the journal
    assert saved(report.pipelines[first.pipeline_id]) == (5, 2, 5.0, 1)


def test_the_report_and_the_costs_command_show_only_what_the_resume_did_not_pay_again(store, db_url):
    first, second = crash_in_node_b(store)
    resume_through_node_b(store, second)
    runner = CliRunner()
    shown = runner.invoke(main, ["--database-url", db_url, "report", str(first.pipeline_id), "--json"])
    assert shown.exit_code == 0, shown.output
    (run_1, run_2) = json.loads(shown.output)["runs"]
    assert {fate: f["calls"] for fate, f in run_1["calls"].items()} == {"kept": 2, "saved": 2}
    assert {fate: f["calls"] for fate, f in run_2["calls"].items()} == {"kept": 1}
    costs = runner.invoke(main, ["--database-url", db_url, "costs", str(first.pipeline_id), "--json"])
    assert costs.exit_code == 0, costs.output
    data = json.loads(costs.output)
    assert (data["saved_calls"], data["saved_cost"], data["replayed_calls"]) == (2, 5.0, 1)
    assert (data["nodes"]["a"]["saved_calls"], data["nodes"]["b"]["saved_calls"]) == (0, 2)


def test_the_roll_up_of_the_finished_pipeline_counts_the_same_savings(store):
    first, second = crash_in_node_b(store)
    resume_through_node_b(store, second)
    assert store.pipelines.complete_node(second, "b")  # the pipeline completes: its ledger is rolled up
    detail = store.reports.provider_costs(first.pipeline_id).pipelines[first.pipeline_id]
    rolled_up = store.reports.metrics_snapshot().provider_costs["job"]
    assert (rolled_up["calls"], rolled_up["saved_calls"], rolled_up["saved_cost"], rolled_up["replayed_calls"]) == \
        saved(detail) == (5, 2, 5.0, 1)


def test_migration_0022_judges_again_the_finished_pipelines_the_old_rule_found_savings_in(db_url):
    from recovery_ext._store.migrations import apply_migrations, load_migrations
    from recovery_ext._store.schema import migrations_table
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(db_url)
    try:
        with store.engine.begin() as conn:  # the database as it was before 0022
            migrations_table.create(conn)
            for m in load_migrations(store.dialect):
                if m.version < 22:
                    for statement in m.statements():
                        conn.exec_driver_sql(statement)
                    conn.execute(migrations_table.insert().values(version=m.version, name=m.name,
                                                                  applied_at=store.dialect.now()))
        first, second = crash_in_node_b(store)
        resume_through_node_b(store, second)
        assert store.pipelines.complete_node(second, "b")
        with store.read() as conn:
            old = conn.exec_driver_sql("SELECT sum(saved_calls) FROM rx_ledger_pipeline_totals").scalar()
        assert old == 4  # node a's two calls counted as saved as well

        assert [m.version for m in apply_migrations(store.engine, store.dialect)][0] == 22

        rolled_up = store.reports.metrics_snapshot().provider_costs["job"]
        assert (rolled_up["saved_calls"], rolled_up["saved_cost"], rolled_up["replayed_calls"]) == (2, 5.0, 1)
    finally:
        store.close()
