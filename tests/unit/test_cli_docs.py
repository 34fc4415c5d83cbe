"""The CLI page's overview names every command the CLI has (the table below it is generated; the overview is not)."""

from __future__ import annotations

import re
from pathlib import Path

from recovery_ext._cli import main

CLI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"


def test_the_overview_names_every_command():
    overview = CLI_PAGE.read_text(encoding="utf-8").split("```")[1]
    named = set(re.findall(r"^recovery-ext ([a-z-]+)", overview, re.MULTILINE))
    library = {name for name, cmd in main.commands.items() if cmd.callback is None
               or cmd.callback.__module__.startswith("recovery_ext")}
    assert library - named == set()
