"""``recovery-ext report``: the timeline model on both databases, and the HTML page in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

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


class _Dom(HTMLParser):
    """Elements of the page Chromium rendered, as (tag, attributes, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def having(self, tag: str, css_class: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and css_class in (a.get("class") or "").split()]


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("the chromium binary is required (Debian package `chromium`; .ci/run installs it)")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120)


def test_the_html_report_renders_in_headless_chromium(sqlite_url, tmp_path):
    from recovery_ext._store.store import RecoveryStore

    store = RecoveryStore(sqlite_url)
    store.migrate()
    with stand_in() as provider:
        crash = crash_and_resume(store, items_before=3, items_after=2, provider=provider)
    store.close()
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["--database-url", sqlite_url, "report", str(crash.pipeline_id),
                                       "--html", str(page), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["file"] == str(page)
    source = page.read_text(encoding="utf-8")
    # Self-contained: no script, no stylesheet link, no image or font fetched from anywhere.
    assert not re.search(r"<script|<link|<img|@import|src=|url\((?!#)", source)
    assert re.findall(r"https?://[^\"' )]+", source) == ["http://www.w3.org/2000/svg"]

    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Dom()
    parsed.feed(dom.stdout)
    runs = parsed.having("g", "run")
    assert [(r["data-epoch"], r["data-run-id"], r["data-outcome"], r["data-items"]) for r in runs] == [
        ("1", crash.first_run, "crashed", "3"), ("2", crash.resume_run, "completed", "2")]
    [reclaim] = parsed.having("g", "reclaim")
    assert (reclaim["data-epoch"], reclaim["data-cause"]) == ("2", "heartbeat")
    assert [f["data-epoch"] for f in parsed.having("g", "fault")] == ["1"]
    assert parsed.having("g", "items-curve")[0]["data-items"] == "5"
    assert {i["data-outcome"] for i in parsed.having("g", "interval") if i["data-lane"] == "waiting"} == {"waiting"}
    assert [r["data-epoch"] for r in parsed.having("tr", "run-row")] == ["1", "2"]
    [calls] = parsed.having("g", "calls")
    assert (calls["data-calls"], calls["data-saved"], calls["data-wasted"], calls["data-kept"]) == ("6", "3", "1", "2")
    cards = {a["data-card"] for a in parsed.having("div", "card")}
    assert {"provider spent", "saved by resume", "wasted"} <= cards
    text = " ".join(parsed.text)
    assert "reclaimed (heartbeat)" in text and "crashed" in text and "completed" in text
    assert f"{provider.calls} calls, {provider.tokens_in + provider.tokens_out:,} tokens" in text

    shot = tmp_path / "report.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1400,900", page.as_uri(), profile=tmp_path / "profile")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1400, 900)
        colours = {c for _, c in image.convert("RGB").getcolors(maxcolors=1 << 20)}
    # The two runs' bars are drawn in their colours (run 1 blue, run 2 violet), and the page is not blank.
    assert (0x3B, 0x82, 0xF6) in colours and (0x8B, 0x5C, 0xF6) in colours
    assert len(colours) > 200 and shot.stat().st_size > 30_000


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
