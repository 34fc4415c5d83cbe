"""The Dagster range: what Dagster and its integrations do not export is imported in one module, and the README
states what is tested."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "recovery_ext" / "_dagster" / "compat.py"
PACKAGES = [ROOT / "recovery_ext", ROOT / "recovery_pipelines"]


def _exported(package: str, name: str) -> bool:
    """Whether ``package`` (``dagster``, ``dagster_celery``...) exports ``name``: listed in its ``__all__``, or,
    for a package without one (Dagster's top level resolves its public names lazily), a public attribute."""
    module = importlib.import_module(package)
    listed = getattr(module, "__all__", None)
    if listed is not None:
        return name in listed
    return not name.startswith("_") and hasattr(module, name)


def _dagster_family(module: str) -> bool:
    top = module.split(".")[0]
    return top == "dagster" or top.startswith("dagster_")


def _unexported_dagster_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import, at any depth of the file, of a name Dagster or one of its
    integrations does not export: anything from a submodule (``dagster._core...``, ``dagster_celery.tasks``)
    and any name a package's top level does not export."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if _dagster_family(a.name) and "." in a.name]
        elif isinstance(node, ast.ImportFrom) and not node.level and _dagster_family(node.module or ""):
            module = node.module or ""
            if "." in module:
                found.append((node.lineno, module, [a.name for a in node.names]))
            elif hidden := [a.name for a in node.names if not _exported(module, a.name)]:
                found.append((node.lineno, module, hidden))
    return found


def test_no_module_but_compat_imports_a_name_dagster_does_not_export():
    offenders = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if path != COMPAT and (imports := _unexported_dagster_imports(path)):
                offenders[str(path.relative_to(ROOT))] = imports
    assert offenders == {}


def test_the_check_sees_names_a_package_does_not_export_however_they_are_spelled(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from dagster import op, _check\nfrom dagster_celery import celery_executor\n"
                      "from dagster_celery.tasks import create_task\nimport dagster._core.events\n"
                      "def f():\n    from dagster_celery.executor import CeleryExecutor\n")
    assert sorted(_unexported_dagster_imports(sample)) == [
        (1, "dagster", ["_check"]), (3, "dagster_celery.tasks", ["create_task"]),
        (4, "dagster._core.events", []), (6, "dagster_celery.executor", ["CeleryExecutor"])]


def test_compat_imports_no_exported_name_privately_and_says_what_each_is_for():
    lines = COMPAT.read_text(encoding="utf-8").splitlines()
    imports = _unexported_dagster_imports(COMPAT)
    assert imports, "compat.py imports nothing private: drop it or this test"
    for lineno, module, names in imports:
        assert len(names) == 1, f"line {lineno}: one name per import line ({names})"
        package = module.split(".")[0]
        assert not _exported(package, names[0]), f"{names[0]} is exported: import it from {package}"
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
