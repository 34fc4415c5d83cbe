"""``recovery-ext report --html``: the page, self-contained, read by a real headless Chromium (its DOM and a
screenshot). A browser start per check, so it runs in tests/process."""

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

from observe_scenario import crash_and_resume, stand_in

from recovery_ext._cli import main


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
