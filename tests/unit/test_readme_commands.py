"""The README's first commands are what a new user runs: CI runs its test command, and it is the fast tier."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_make_targets() -> list[str]:
    first_block = ROOT.joinpath("README.md").read_text(encoding="utf-8").split("```bash\n", 1)[1].split("```", 1)[0]
    return re.findall(r"^make ([\w-]+)", first_block, re.MULTILINE)


def test_the_readme_starts_with_the_dev_server_and_the_fast_tests_and_ci_runs_them_and_the_whole_suite():
    assert _readme_make_targets() == ["dev", "test-fast"]
    ci = ROOT.joinpath(".ci", "run").read_text(encoding="utf-8")
    ran = re.findall(r"^make ([\w-]+)$", ci, re.MULTILINE)
    assert "test-fast" in ran and ("test" in ran or "test-slow" in ran)
    # test-fast and test-slow together are the whole suite: every tier, each once
    makefile = ROOT.joinpath("Makefile").read_text(encoding="utf-8")
    fast, slow = (re.findall(r" (tests/\w+)", re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile,
                                                            re.MULTILINE).group(1))
                  for target in ("test-fast", "test-slow"))
    tiers = sorted(p.name for p in ROOT.joinpath("tests").iterdir() if p.is_dir() and p.name not in ("support",)
                   and not p.name.startswith("__"))
    assert sorted(fast + slow) == [f"tests/{t}" for t in tiers]
