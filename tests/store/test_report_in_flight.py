"""``recovery-ext report`` on a pipeline whose worker died with a provider call in flight (SQLite and PostgreSQL):
the call was written to the ledger before its request left and its answer never came, so the page shows it
as in flight at the crash, outcome unknown, and never as wasted."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner
from helpers import expire

from recovery_ext import scan
from recovery_ext._cli import main
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import ItemCheckpoint, ProviderCall

ENDPOINT = "http://127.0.0.1:9/v1"


def call(own, item: str, **kw) -> ProviderCall:
    return ProviderCall(endpoint=ENDPOINT, model="m", pipeline_id=own.pipeline_id, node_name="a", item_key=item,
                        run_id=own.owner, epoch=own.epoch, **kw)


def test_a_call_in_flight_at_a_crash_is_reported_as_in_flight_not_wasted(store, db_url, tmp_path):
    first = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(first, "a")
    store.pipelines.checkpoint_item(first, "a", ItemCheckpoint("k0", {"n": 0}, calls=(call(first, "k0", tokens_in=10,
                                                                                  tokens_out=5),)))
    # the next item's request is journaled as it leaves (its ledger row in flight); the worker dies before
    # the answer arrives
    assert store.providers.journal_begin(first, call(first, "k1", outcome=IN_FLIGHT), call_key="fp#1") is None
    expire(store, first.pipeline_id)
    assert [r.pipeline_id for r in scan(store).reclaimed_pipelines] == [first.pipeline_id]
    second = store.pipelines.attach(first.pipeline_id, "run-2", resume_number=1)
    store.pipelines.start_node(second, "a")
    store.pipelines.checkpoint_item(second, "a", ItemCheckpoint("k1", {"n": 1}, calls=(call(second, "k1", tokens_in=12,
                                                                                    tokens_out=6),)))
    store.pipelines.complete_node(second, "a")
    f = store.reports.provider_costs(first.pipeline_id).pipelines[first.pipeline_id]
    assert (f.calls, f.in_flight_unknown_calls, f.wasted_calls) == (3, 1, 0)

    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["--database-url", db_url, "report", str(first.pipeline_id), "--html",
                                       str(page), "--json"])
    assert result.exit_code == 0, result.output
    (run_1, run_2) = json.loads(result.output)["runs"]
    assert {fate: figures["calls"] for fate, figures in run_1["calls"].items()} == {"saved": 1, "in_flight": 1}
    assert {fate: figures["calls"] for fate, figures in run_2["calls"].items()} == {"kept": 1}
    source = page.read_text(encoding="utf-8")
    (calls,) = re.findall(r'<g class="calls" ([^>]*)>', source)
    fates = dict(re.findall(r'data-([\w-]+)="(\d+)"', calls))
    assert (fates["calls"], fates["in_flight"], fates["wasted"]) == ("3", "1", "0")
    assert "1 in flight at a crash: outcome unknown" in source  # the calls' tooltip
    assert "wasted: never checkpointed" not in source.split('<g class="calls"')[1].split("</title>")[0]
    # the legend names the tick's colour, and run 1's row says what became of its call
    assert re.search(r'class="legend">.*call in flight at a crash: outcome unknown', source)
    (row_1,) = re.findall(r'<tr class="run-row" data-epoch="1">.*?</tr>', source)
    assert "1 in flight at the crash (outcome unknown)" in row_1 and "wasted" not in row_1
