"""Every python and bash block of the README and of the docs site (docs/**/*.md) runs as written.

The blocks of one page run in order, in one temporary directory of that page with a fresh DAGSTER_HOME and no
application database configured (the library's default: SQLite under DAGSTER_HOME), with this interpreter's
`bin` first on PATH. A block the README says to save ("Save this as `my_assets.py`:") is written to
that file. The README's own code holds the stand-ins, each marked "in real life"; nothing is
substituted here. A block is skipped only when the page marks it, visibly, with a preceding
`<!-- not run: reason -->`; the reasons allowed are few and listed here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOC_PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# What the runs of a page's blocks print, page by page: proof that the examples did their work.
EXPECTED_OUTPUT = {
    "README.md": [r"'summaries': \{'doc-0': \{'summary': 'a summary of doc-0'\}", r"\bcompleted\b"],
    "docs/get-started/quickstart.md": [r"'summaries': \{'doc-0': \{'summary': 'a summary of doc-0'\}",
                                       r"(?m)^10000$", r"\bcompleted\b"],
    "docs/how-to/assets.md": [r"\bcompleted\b"],
    "docs/how-to/parallel-items.md": [r"(?m)^40$"],
    "docs/how-to/ledger.md": [],
    "docs/how-to/classifier.md": [],
    "docs/how-to/journal.md": [r"(?m)^3$", r"INVOICE 101\nTotal due 11.10 EUR\njobs started: 1"],
    "docs/how-to/anthropic-batches.md": [r"a description of Describe the table orders in one sentence\.\n"
                                         r"batches created: 1"],
    "docs/how-to/bedrock-batches.md": [r"a description of Describe the table orders in one sentence\.\n"
                                       r"jobs created: 1"],
    "docs/how-to/gemini-batches.md": [r"a description of Describe the table orders in one sentence\.\n"
                                      r"batches created: 1"],
    "docs/how-to/azure-document-intelligence.md": [r"INVOICE 101\nTotal due 11.10 EUR\nanalyses started: 2"],
    "docs/how-to/metrics.md": [r"chat claude-x"],
    "docs/how-to/kubernetes.md": [],
    "docs/how-to/retention.md": [r"(?m)^7776000(\.0)?$"],
    "docs/how-to/spend-caps.md": [r"(?m)^True$", r"pipeline:1\s+1000\s+240\s+0\s+760\b",
                                  r"pipeline:1\s+5000\s+240\s+0\s+4760\b"],
    "docs/reference/api.md": [r"'status': 'running', 'count': 1", r"'queue': 'ocr', 'status': 'ready', 'count': 1"],
}
SAVED = {"docs/how-to/assets.md": "my_assets.py"}
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
SAVE_AS = re.compile(r"Save this as\s+`([\w.-]+)`:\s*$")
RUNNABLE = ("python", "bash")
# Why a block may stay unrun: it starts a server, runs the whole suite, or installs into the reader's
# own environment. Anything else must run.
ALLOWED_REASONS = ("starts a server", "installs into your own environment")


@dataclass
class Block:
    language: str
    code: str
    line: int
    not_run: str | None = None
    save_as: str | None = None


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = [line for line in lines[max(0, start - 3):start] if line.strip()]
        marker = NOT_RUN.search(before[-1]) if before else None
        saved = SAVE_AS.search(" ".join(before))
        blocks.append(Block(fence.group(1), "\n".join(lines[start + 1:end]) + "\n", start + 1,
                            marker.group(1) if marker else None, saved.group(1) if saved else None))
        i = end + 1
    return blocks


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", DOC_PAGES, ids=_name)
def test_a_page_marks_only_servers_and_installs_as_not_run(page):
    blocks = readme_blocks(page.read_text())
    skipped = [b for b in blocks if b.not_run]
    assert all(b.language in RUNNABLE for b in skipped)
    for block in skipped:
        assert any(reason in block.not_run for reason in ALLOWED_REASONS), (block.line, block.not_run)
    assert len(skipped) <= 3, [b.line for b in skipped]


def test_every_page_with_examples_is_checked_and_examples_are_there():
    runnable = {_name(page): [b for b in readme_blocks(page.read_text()) if b.language in RUNNABLE and not b.not_run]
                for page in DOC_PAGES}
    # a page that gains an example gains an entry in EXPECTED_OUTPUT (what its run must print)
    assert {name for name, blocks in runnable.items() if blocks} == set(EXPECTED_OUTPUT)
    # the blocks left to run are the examples a reader copies
    assert sum(len(blocks) for blocks in runnable.values()) >= 6


@pytest.mark.parametrize("module", ["recovery_ext", "recovery_ext.store", "recovery_ext.testing"])
def test_the_api_reference_lists_every_public_name_once(module):
    import importlib

    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    listed = re.findall(rf"^::: {re.escape(module)}\.(\w+)$", text, re.MULTILINE)
    assert sorted(listed) == sorted(importlib.import_module(module).__all__)


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    if block.language == "python":
        script = cwd / f"readme_block_{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", [ROOT / name for name in EXPECTED_OUTPUT], ids=lambda p: _name(p))
def test_every_python_and_bash_block_of_a_page_runs_as_written(page, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERY_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(tmp_path / "dagster_home"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    (tmp_path / "dagster_home").mkdir()
    ran = []
    for block in readme_blocks(page.read_text()):
        if block.language not in RUNNABLE or block.not_run:
            continue
        if block.save_as:
            (tmp_path / block.save_as).write_text(block.code)
            ran.append((block.line, f"saved as {block.save_as}"))
            continue
        done = run_block(block, tmp_path, env)
        assert done.returncode == 0, (f"{_name(page)} block at line {block.line} failed (exit {done.returncode}):\n"
                                      f"{block.code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
                                      f"{done.stderr[-3000:]}")
        ran.append((block.line, done.stdout))
    outputs = "\n".join(out for _, out in ran)
    for pattern in EXPECTED_OUTPUT[_name(page)]:
        assert re.search(pattern, outputs), (pattern, outputs[-3000:])
    if _name(page) in SAVED:
        assert any(what == f"saved as {SAVED[_name(page)]}" for _, what in ran)
