"""``recovery-ext report``: the timeline model on both databases (the HTML page in a real headless Chromium is
tests/process/test_report_chromium.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import expire
from observe_scenario import crash_and_resume, stand_in

from recovery_ext._cli import main
from recovery_ext._observe.timeline import build_timeline

ROOT = Path(__file__).resolve().parents[2]


def test_the_timeline_shows_each_run_its_crash_reclaim_wait_items_and_provider_calls(store):
    with stand_in() as provider:
        crash = crash_and_resume(store, items_before=3, items_after=2, provider=provider)
    t = build_timeline(store.reports.pipeline_history(crash.pipeline_id)).as_dict()
    runs = [(r["epoch"], r["run_id"], r["began"], r["cause"], r["outcome"], r["items"]) for r in t["runs"]]
    assert runs == [(1, crash.first_run, "created", None, "crashed", {"completed": 3}),
                    (2, crash.resume_run, "reclaimed", "heartbeat", "completed", {"completed": 2})]
    first, second = t["runs"]
    assert first["ended_at"] < second["started_at"] <= second["ended_at"]
    kinds = [m["kind"] for m in t["markers"]]
    assert kinds == ["fault", "reclaim", "completed"]
    assert t["waited_seconds"] > 0
    # Each run's calls by fate, and they add up to the ledger's figures for the pipeline.
    tokens = lambda calls: sum(c.tokens_in + c.tokens_out for c in calls)  # noqa: E731
    assert {f: (v["calls"], v["tokens"]) for f, v in first["calls"].items()} == {
        "saved": (3, tokens(crash.saved)), "wasted": (1, tokens(crash.wasted))}
    assert {f: (v["calls"], v["tokens"]) for f, v in second["calls"].items()} == {"kept": (2, tokens(crash.resumed))}
    costs = t["costs"]
    assert (costs["calls"], costs["tokens_in"], costs["tokens_out"]) == (provider.calls, provider.tokens_in,
                                                                         provider.tokens_out)
    assert (costs["saved_calls"], costs["wasted_calls"]) == (3, 1)
    assert costs["wasted_cost"] == pytest.approx(crash.wasted[0].cost)


def test_a_running_pipeline_taken_over_and_waiting_is_drawn_as_it_stands(store):
    own = store.pipelines.create_pipeline("ocr", ["a"], owner="r1", origin_run_id="r1")
    store.pipelines.start_node(own, "a")
    expire(store, own.pipeline_id)
    store.pipelines.take_over(own.pipeline_id, "r2")
    again = store.pipelines.owned_by("r2")
    store.pipelines.start_node(again, "a")
    store.providers.set_waiting(again, 30, "429 Too Many Requests")
    t = build_timeline(store.reports.pipeline_history(own.pipeline_id))
    assert [(r.epoch, r.run_id, r.began, r.outcome) for r in t.runs] == [
        (1, "r1", "created", "superseded"), (2, "r2", "taken_over", "running")]
    lanes = {(i.lane, i.epoch, i.outcome) for i in t.intervals}
    assert lanes == {("a", 1, "reset"), ("a", 2, "running"), ("waiting", 2, "waiting")}
    assert t.pipeline.shown_status == "waiting"


def test_report_of_a_missing_pipeline_or_to_a_missing_folder_fails_clearly(store, db_url, tmp_path):
    crash = crash_and_resume(store)
    missing = CliRunner().invoke(main, ["--database-url", db_url, "report", "999", "--html", str(tmp_path / "x.html")])
    assert missing.exit_code == 1 and "no pipeline 999" in missing.output
    target = tmp_path / "nowhere" / "x.html"
    nowhere = CliRunner().invoke(main, ["--database-url", db_url, "report", str(crash.pipeline_id), "--html",
                                        str(target)])
    assert nowhere.exit_code == 1 and "No such file or directory" in nowhere.output
    assert "Traceback" not in nowhere.output and not list(tmp_path.glob("**/*.partial"))


def test_report_json_alone_prints_the_timeline_and_writes_no_page(store, db_url, tmp_path, monkeypatch):
    # `--json` prints the timeline as data (docs/how-to/reports.md); it needs no --html page beside it.
    crash = crash_and_resume(store, items_before=3, items_after=2)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    result = CliRunner().invoke(main, ["--database-url", db_url, "report", str(crash.pipeline_id), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    expected = build_timeline(store.reports.pipeline_history(crash.pipeline_id)).as_dict()
    assert "file" not in data and set(data) == set(expected)
    assert [(r["run_id"], r["outcome"], r["items"]) for r in data["runs"]] == [
        (crash.first_run, "crashed", {"completed": 3}), (crash.resume_run, "completed", {"completed": 2})]
    # Neither --html nor --json: one clear usage line (exit 2).
    neither = CliRunner().invoke(main, ["--database-url", db_url, "report", str(crash.pipeline_id)])
    assert neither.exit_code == 2 and "give --html FILE" in neither.output, neither.output
    assert "Traceback" not in neither.output
    assert list(workdir.iterdir()) == []  # no page, no partial file, no ./.dagster_home
