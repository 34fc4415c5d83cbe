"""The Dagster range: private Dagster imports live in one module, and the README states what is tested."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import dagster

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "recovery_ext" / "_dagster" / "compat.py"
PACKAGES = [ROOT / "recovery_ext", ROOT / "recovery_pipelines"]


def _private_dagster_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of a ``dagster._`` module, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("dagster._")]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("dagster._"):
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module == "dagster":
            found += [(node.lineno, f"dagster.{a.name}", []) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("dagster_"):
            # an integration's private name (dagster_celery.executor._submit_task) is private Dagster too
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private or "._" in node.module:
                found.append((node.lineno, node.module, private or [a.name for a in node.names]))
    return found


def test_no_module_but_compat_imports_a_private_dagster_module():
    offenders = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if path != COMPAT and (imports := _private_dagster_imports(path)):
                offenders[str(path.relative_to(ROOT))] = imports
    assert offenders == {}


def test_compat_imports_no_public_name_privately_and_says_what_each_is_for():
    lines = COMPAT.read_text(encoding="utf-8").splitlines()
    imports = _private_dagster_imports(COMPAT)
    assert imports, "compat.py imports nothing private: drop it or this test"
    for lineno, module, names in imports:
        assert len(names) == 1, f"line {lineno}: one name per import line ({names})"
        assert not hasattr(dagster, names[0]), f"{names[0]} is public: import it from dagster"
        comment = lines[lineno - 2].strip()
        assert comment.startswith("# ") and len(comment) > 10, f"line {lineno}: say what {names[0]} is for"


def test_the_library_imports_from_compat_only_names_compat_defines():
    exported = set(ast.literal_eval(next(
        n.value for n in ast.parse(COMPAT.read_text(encoding="utf-8")).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__")))
    for path in (ROOT / "recovery_ext").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_dagster.compat"):
                assert {a.name for a in node.names} <= exported, path


def _declared_range() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (dagster,) = [d for d in deps if re.match(r"dagster\s*[<>=!~]", d)]
    return dagster


def test_the_core_declares_a_dagster_range_admitting_both_tested_releases():
    spec = _declared_range()
    assert "==" not in spec, spec
    bounds = dict(re.findall(r"(>=|<)\s*([\d.]+)", spec))

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(p) for p in version.split("."))

    for tested in ("1.12.22", "1.13.27"):
        assert key(bounds[">="]) <= key(tested) < key(bounds["<"]), (spec, tested)


def test_the_readme_states_the_tested_range():
    head = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:30])
    assert re.search(r"Tested with Dagster 1\.12\.22 and 1\.13\.27", head), "README: state the tested Dagster range"


def test_ci_tests_the_declared_lower_bound():
    """.ci/run installs the oldest release under .ci/dagster-oldest.txt: it must be the range's lower bound."""
    pins = dict(re.findall(r"^([\w-]+)==([\d.]+)$", (ROOT / ".ci" / "dagster-oldest.txt").read_text(), re.M))
    assert pins["dagster"] == dict(re.findall(r"(>=|<)\s*([\d.]+)", _declared_range()))[">="]
    assert "dagster-oldest.txt" in (ROOT / ".ci" / "run").read_text()
