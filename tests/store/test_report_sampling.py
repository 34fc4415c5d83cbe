"""``report --html`` draws every run's items however many there are: past the drawing limit the curve goes
through every step-th checkpoint of the whole span, counts stay exact, and the page says what it sampled."""

from __future__ import annotations

import re

from click.testing import CliRunner

from helpers import expire

from recovery_ext._cli import main
from recovery_ext._observe.report import RUN_COLOURS
from recovery_ext._store import observability
from recovery_ext._store.models import ItemCheckpoint, ProviderCall


def _checkpoint(store, own, keys):
    for key in keys:
        call = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=2, tokens_out=1)
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint(key, 1, calls=(call,)))


def test_past_the_limit_every_run_is_drawn_counts_are_exact_and_the_page_says_it_sampled(store, db_url, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setattr(observability, "ITEM_TIMES_LIMIT", 50)  # the same cut as 50,000 of 80,000, smaller
    own = store.pipelines.create_pipeline("job", ["a"], owner="r1", origin_run_id="r1")
    store.pipelines.start_node(own, "a")
    _checkpoint(store, own, [f"first-{i:03d}" for i in range(120)])
    expire(store, own.pipeline_id)
    again = store.pipelines.take_over(own.pipeline_id, "r2")
    store.pipelines.start_node(again, "a")
    _checkpoint(store, again, [f"second-{i:03d}" for i in range(80)])

    history = store.reports.pipeline_history(own.pipeline_id)
    assert history.item_count == 200 and len(history.item_times) <= 51 and history.item_times_step == 4
    assert history.item_times[-1][0] == 2  # the resume run's items are drawn, up to the last one
    assert history.call_count == 200 and history.calls_step == 4

    page_path = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["--database-url", db_url, "report", str(own.pipeline_id), "--html",
                                       str(page_path)])
    assert result.exit_code == 0, result.output
    page = page_path.read_text()
    assert 'data-items="200"' in page and ">200 items<" in page and 'data-calls="200"' in page
    assert RUN_COLOURS[1] in re.search(r'<g class="items-curve".*?</g>', page, re.S).group(0)
    assert "every 4th of the 200 item checkpoints" in page and "one provider-call tick is drawn per 4" in page
    assert re.search(r"120 \+ 80", page)  # the card and the runs table: every item, by run
