"""Every python and bash block of the README runs as written.

The blocks run in order, in one temporary directory with a fresh DAGSTER_HOME and no application
database configured (the library's default: SQLite under DAGSTER_HOME), with this interpreter's
`bin` first on PATH. A block the README says to save ("Save this as `my_assets.py`:") is written to
that file. The README's own code holds the stand-ins, each marked "in real life"; nothing is
substituted here. A block is skipped only when the README marks it, visibly, with a preceding
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

README = Path(__file__).resolve().parents[2] / "README.md"
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


def test_the_readme_marks_only_servers_and_installs_as_not_run():
    blocks = readme_blocks(README.read_text())
    skipped = [b for b in blocks if b.not_run]
    assert all(b.language in RUNNABLE for b in skipped)
    for block in skipped:
        assert any(reason in block.not_run for reason in ALLOWED_REASONS), (block.line, block.not_run)
    assert len(skipped) <= 3, [b.line for b in skipped]
    # the blocks left to run are the examples a reader copies
    assert sum(1 for b in blocks if b.language in RUNNABLE and not b.not_run) >= 4


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
def test_every_python_and_bash_block_of_the_readme_runs_as_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERY_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(tmp_path / "dagster_home"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    (tmp_path / "dagster_home").mkdir()
    ran = []
    for block in readme_blocks(README.read_text()):
        if block.language not in RUNNABLE or block.not_run:
            continue
        if block.save_as:
            (tmp_path / block.save_as).write_text(block.code)
            ran.append((block.line, f"saved as {block.save_as}"))
            continue
        done = run_block(block, tmp_path, env)
        assert done.returncode == 0, (f"README block at line {block.line} failed (exit {done.returncode}):\n"
                                      f"{block.code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
                                      f"{done.stderr[-3000:]}")
        ran.append((block.line, done.stdout))
    outputs = "\n".join(out for _, out in ran)
    assert "'summaries': {'doc-0': {'summary': 'a summary of doc-0'}" in outputs  # the first example's run
    assert "\n10000\n" in f"\n{outputs}"                                        # the batched example's run
    assert re.search(r"\bcompleted\b", outputs)                                 # recovery-ext status after the asset
    assert any(what == "saved as my_assets.py" for _, what in ran)
