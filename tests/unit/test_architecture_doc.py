"""docs/explanation/architecture.md names modules and functions: each still exists.

Inline references in backquotes are checked exactly: a path (``_store/recovery.py``, ``_dagster/``,
``bench/files_crossed.py``), and ``path.py:Name.attribute`` resolved on the imported module. Every ``name.py``
written anywhere on the page, code blocks included, names a file of the library, the pipelines or the benches.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "recovery_ext"
DOC = ROOT / "docs" / "explanation" / "architecture.md"
REFERENCE = re.compile(r"^(?P<path>(?:[\w.]+/)*[\w.]+\.py|(?:\w+/)+)(?::(?P<name>[\w.]+))?$")


def _inline_references(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [token for token in re.findall(r"`([^`\n]+)`", prose) if REFERENCE.match(token)]


def _missing(token: str) -> str | None:
    """Why ``token`` does not resolve, or None when it does."""
    match = REFERENCE.match(token)
    assert match
    path = next((base / match["path"] for base in (LIBRARY, ROOT) if (base / match["path"]).exists()), None)
    if path is None:
        return f"{token}: no such file or folder"
    if match["name"]:
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        target: object = module
        for part in match["name"].split("."):
            if not hasattr(target, part):
                return f"{token}: {part} not found"
            target = getattr(target, part)
    return None


def test_every_module_and_function_the_page_names_exists():
    references = _inline_references(DOC.read_text(encoding="utf-8"))
    assert len(references) >= 20  # the page still cites the code it explains
    assert [why for token in references if (why := _missing(token))] == []


def test_every_file_name_on_the_page_is_a_file_of_the_project():
    files = {p.name for folder in ("recovery_ext", "recovery_pipelines", "bench", "tests")
             for p in (ROOT / folder).rglob("*.py")} | {"definitions.py"}
    named = set(re.findall(r"\b(\w+\.py)\b", DOC.read_text(encoding="utf-8")))
    assert sorted(named - files) == []


def test_the_check_finds_a_name_that_is_gone():
    assert _missing("_store/recovery.py:Recovery.recovery_pass") is None
    assert _missing("_store/recovery.py:Recovery.no_such_method") == \
        "_store/recovery.py:Recovery.no_such_method: no_such_method not found"
    assert _missing("_recovery/gone.py") == "_recovery/gone.py: no such file or folder"
    assert _inline_references("`a/b.py:f` and `text`\n```\n`c/d.py`\n```\n") == ["a/b.py:f"]
