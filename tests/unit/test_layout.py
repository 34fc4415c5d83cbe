"""The package's shape: a public face, private modules, layers in order and without cycles, pipelines apart."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import recovery_ext

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "recovery_ext"
PIPELINES = ROOT / "recovery_pipelines"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of the file (lazy imports count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _library_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in LIBRARY.rglob("*.py")}


# The public face: the everyday names at the top, and the advanced APIs in named public submodules.
PUBLIC_MODULES = ["recovery_ext", "recovery_ext.store", "recovery_ext.testing"]


def test_every_module_but_the_public_ones_is_private():
    public = [name for name in _library_modules()
              if not any(part.startswith("_") for part in name.split(".")[1:2])]
    assert sorted(public) == sorted(PUBLIC_MODULES)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_each_public_module_resolves_every_name_it_lists(module):
    imported = importlib.import_module(module)
    for name in imported.__all__:
        assert getattr(imported, name) is not None, name
    assert sorted(imported.__all__) == sorted(set(imported.__all__))


def test_the_top_level_lists_only_what_it_offers():
    assert sorted(dir(recovery_ext)) == sorted(recovery_ext.__all__)


def test_the_two_levels_share_no_name():
    levels = [set(importlib.import_module(module).__all__) for module in PUBLIC_MODULES]
    assert [a & b for i, a in enumerate(levels) for b in levels[i + 1:]] == [set()] * 3


def test_a_name_that_moved_still_answers_at_the_top_with_a_deprecation():
    import recovery_ext.store
    import recovery_ext.testing

    for module in (recovery_ext.store, recovery_ext.testing):
        for name in module.__all__:
            if name.endswith("Store") and name != "RecoveryStore":
                continue  # the component protocols are new in recovery_ext.store: never at the top
            with pytest.warns(DeprecationWarning, match=f"recovery_ext.{name} moved to {module.__name__}.{name}"):
                assert getattr(recovery_ext, name) is getattr(module, name)
    with pytest.raises(AttributeError):
        recovery_ext.no_such_name  # noqa: B018


def test_importing_the_package_does_not_import_dagster_or_opentelemetry():
    """The CLI and pure-Python users of the classifier and the store do not pay for Dagster, nor anyone for
    OpenTelemetry until they switch it on."""
    code = ("import sys, recovery_ext, recovery_ext._cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'opentelemetry'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("sdk", "extra", "adapter", "modules"), [
    ("botocore", "aws", "TextractJobs",
     ["recovery_ext._providers.bedrock_batch", "recovery_ext._providers.textract_jobs"]),
    ("anthropic", "anthropic", "AnthropicBatchJobs", ["recovery_ext._providers.anthropic_batch"]),
    ("google-genai", "gemini", "GeminiBatchJobs", ["recovery_ext._providers.gemini_batch"]),
    ("azure-ai-documentintelligence", "azure", "AzureDocumentJobs", ["recovery_ext._providers.azure_document_jobs"]),
])
def test_a_provider_sdk_is_an_extra_imported_only_by_its_adapters_and_only_when_they_connect(sdk, extra, adapter,
                                                                                             modules):
    """``pip install recovery-ext`` does not pull a provider's SDK (only its extra does), and importing the
    package, the Dagster layer or the adapter does not import it: the adapter takes the application's client."""
    from importlib.metadata import requires

    declared = [r.partition(";")[2] for r in requires("recovery-ext") or [] if r.lower().startswith(sdk)]
    sdk = {"google-genai": "google", "azure-ai-documentintelligence": "azure"}.get(sdk, sdk)  # its import name
    assert declared and all("extra ==" in marker for marker in declared)  # never in the core
    assert any(f"'{extra}'" in marker.replace('"', "'") for marker in declared)
    importers = sorted(name for name, path in _library_modules().items()
                       if any(m.split(".")[0] == sdk for m in _imports(path)))
    assert importers == modules
    code = (f"import sys, recovery_ext; recovery_ext.run_provider_job; recovery_ext.{adapter}; "
            f"print({ {'google': 'google.genai', 'azure': 'azure.core'}.get(sdk, sdk)!r} in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_only_the_opentelemetry_module_imports_opentelemetry():
    offenders = sorted(name for name, path in _library_modules().items() if name != "recovery_ext._observe.otel"
                       and any(m.split(".")[0] == "opentelemetry" for m in _imports(path)))
    assert offenders == []
    assert any(m.split(".")[0] == "opentelemetry" for m in _imports(LIBRARY / "_observe" / "otel.py"))


def test_the_library_never_imports_the_pipelines():
    offenders = {name: sorted(m for m in _imports(path) if m.split(".")[0] == "recovery_pipelines")
                 for name, path in _library_modules().items()}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def _is_public(module_or_name: str) -> bool:
    """A public module, or a name one of them lists (``recovery_ext.store.RecoveryStore``)."""
    if module_or_name in PUBLIC_MODULES:
        return True
    module, _, name = module_or_name.rpartition(".")
    return module in PUBLIC_MODULES and name in importlib.import_module(module).__all__


def test_the_pipelines_use_only_the_public_api():
    offenders = {}
    for path in PIPELINES.rglob("*.py"):
        private = sorted(m for m in _imports(path) if m.startswith("recovery_ext.") and not _is_public(m))
        if private:
            offenders[path.name] = private
    assert offenders == {}


def test_only_the_dagster_layer_imports_dagster():
    offenders = sorted(name for name, path in _library_modules().items()
                       if not name.startswith("recovery_ext._dagster")
                       and any(m == "dagster" or m.startswith("dagster.") or m.startswith("dagster_")
                               for m in _imports(path)))
    assert offenders == []


def test_no_import_cycles_between_library_modules():
    modules = _library_modules()
    graph = {name: {m for m in _imports(path) if m in modules and m != name and m != "recovery_ext"}
             for name, path in modules.items()}
    # A package's __init__ that only re-exports is reached from its submodules' parents; cycles through the
    # top-level package (lazy public exports) are not real dependencies.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == []


# The layers, lowest first, as docs/explanation/architecture.md draws them. A module imports its own package and
# the packages of lower layers; packages that share a layer do not import each other.
LAYERS: list[set[str]] = [
    {"_errors"},
    {"_settings", "_conventions", "_processes"},
    {"_classify"},
    {"_store"},
    {"_liveness", "_providers", "_recovery"},
    {"_observe"},
    {"_dagster"},
    {"_cli_common"},  # what every command shares
    {"_cli_spend"},  # a command module, registered by _cli
    {"_cli", "__init__", "store", "testing"},
]


def _package_of(module: str) -> str:
    """``recovery_ext._store.pipelines`` -> ``_store``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import of a package in the same layer or a higher one."""
    found = []
    for name, imported in sorted(graph.items()):
        own = _package_of(name)
        for other_module in sorted(m for m in imported if m in graph):
            other = _package_of(other_module)
            if other != own and _layer_of(other) >= _layer_of(own):
                found.append(f"{name} -> {other_module}")
    return found


def test_every_library_package_has_a_layer():
    assert sorted({_package_of(name) for name in _library_modules()} - set().union(*LAYERS)) == []


def test_each_layer_imports_only_the_layers_below_it():
    graph = {name: _imports(path) for name, path in _library_modules().items()}
    assert _upward_imports(graph) == []


def test_the_layer_check_sees_an_import_that_runs_back_up():
    graph = {"recovery_ext._store.pipelines": {"recovery_ext._liveness.processes", "recovery_ext._store.models"},
             "recovery_ext._liveness.processes": set(), "recovery_ext._store.models": {"recovery_ext._errors"},
             "recovery_ext._errors": set(), "recovery_ext._providers.guard": {"recovery_ext._recovery.protocol"},
             "recovery_ext._recovery.protocol": set()}
    assert _upward_imports(graph) == ["recovery_ext._providers.guard -> recovery_ext._recovery.protocol",
                                      "recovery_ext._store.pipelines -> recovery_ext._liveness.processes"]


# Transaction context managers and helpers that run inside their caller's transaction: not store calls of their own.
_NOT_RETRIED = {"read", "read_only", "read_statement", "write", "autocommit", "driver_autocommit", "fenced",
                "close", "wrap_error", "wrap_driver_error", "migrate", "pending_migrations",
                # each of its batches is a retried transaction of its own; retrying the whole would redo them
                "prune_finished_pipelines",
                # a scrape answers `up 0` within its deadline instead of waiting out an outage
                "scrape_snapshot"}


def test_every_store_call_that_opens_a_transaction_declares_its_retries():
    import inspect

    from recovery_ext._store.database import Database

    missing, wrong = [], []
    for name, member in inspect.getmembers(Database, inspect.isfunction):
        if name.startswith("_"):
            continue
        retried = getattr(member, "__rx_retried__", False)
        runs_inside_caller = "conn" in inspect.signature(member).parameters or name in _NOT_RETRIED
        if not runs_inside_caller and not retried:
            missing.append(name)
        if runs_inside_caller and retried:
            wrong.append(name)
    assert missing == [] and wrong == []
    assert not hasattr(__import__("recovery_ext._store.store", fromlist=["x"]), "_retry_every_store_call")


def test_every_exception_a_user_can_receive_derives_from_one_base_and_is_exported():
    """Any public exception class defined in the library (not ``_Private`` control flow) is a RecoveryError and
    importable from ``recovery_ext``, so ``except recovery_ext.RecoveryError`` catches everything the library raises."""
    defined: dict[str, str] = {}
    for name, path in _library_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined[node.name] = name
    import importlib

    exceptions = {}
    for cls_name, module in defined.items():
        obj = getattr(importlib.import_module(module), cls_name, None)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            exceptions[cls_name] = obj
    # click's own error type for a malformed CLI argument is click's to render, not the API's
    exceptions.pop("BadArgument", None)
    assert {"CircuitOpen", "OutageBudgetExceeded", "EscalatedError", "MigrationError", "UnresumableSelection",
            "MissingRunLiveness"} <= set(exceptions)
    assert sorted(n for n, cls in exceptions.items() if not issubclass(cls, recovery_ext.RecoveryError)) == []
    assert sorted(n for n in exceptions if getattr(recovery_ext, n, None) is not exceptions[n]) == []


def _compares_a_dialect_name(node: ast.Compare) -> bool:
    """``<something>dialect.name == ...`` (or !=, in, not in), on either side."""
    def is_dialect_name(expr: ast.expr) -> bool:
        if not (isinstance(expr, ast.Attribute) and expr.attr == "name"):
            return False
        owner = expr.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        return owner_name.lower().endswith("dialect")

    return any(is_dialect_name(e) for e in [node.left, *node.comparators])


def test_only_the_dialects_module_asks_which_database_it_talks_to():
    """Each database's differences are methods and attributes of its Dialect subclass: no call site compares
    a dialect's name (the library, the demo pipelines and the benchmarks alike)."""
    dialects = LIBRARY / "_store" / "dialects.py"
    files = [*LIBRARY.rglob("*.py"), *PIPELINES.rglob("*.py"), *(ROOT / "bench").rglob("*.py"), ROOT / "definitions.py"]
    found = []
    for path in files:
        if path == dialects:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and _compares_a_dialect_name(node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_the_dialect_name_check_sees_a_comparison():
    tree = ast.parse("if self.dialect.name == 'sqlite': pass\nok = store.dialect.name\nx = nodes.c.name == 'a'")
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Compare) and _compares_a_dialect_name(n)]
    assert len(hits) == 1


def _foreign_private_store_reads(path: Path) -> list[int]:
    """Lines that read ``<something but self>._store``: another object's private store."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr == "_store"
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")]


def test_no_module_reaches_into_another_objects_private_store():
    """A node's helpers are handed the store (``store_of(ctx)``, ``CallJournal(scope, store)``); the one read of
    ``ctx._store`` is ``store_of`` itself, in the module that owns the attribute."""
    found = {name: len(lines) for name, path in _library_modules().items()
             if (lines := _foreign_private_store_reads(path))}
    assert found == {"recovery_ext._dagster.context": 1}
