"""What installing the library brings: the core only, the demo's stack in extras, every import declared."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

from lean_install import HEAVY

ROOT = Path(__file__).resolve().parents[2]
# import name -> distribution name, where they differ
DISTRIBUTION = {"psycopg": "psycopg", "yaml": "pyyaml", "rapidocr_onnxruntime": "rapidocr-onnxruntime",
                "PIL": "pillow", "dagster_graphql": "dagster-graphql", "dagster_postgres": "dagster-postgres",
                "prometheus_client": "prometheus-client", "opentelemetry": "opentelemetry-api",
                "google": "google-genai",  # the library imports google.genai only (GeminiBatchJobs.connect)
                # azure.ai.documentintelligence and the azure.core under it (AzureDocumentJobs only)
                "azure": "azure-ai-documentintelligence"}


def _requirements() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = lambda req: req.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()  # noqa: E731
    core = {name(r) for r in project["dependencies"]}
    extras = {extra: {name(r) for r in reqs} for extra, reqs in project["optional-dependencies"].items()}
    return core, extras


def _third_party_imports(package: Path) -> set[str]:
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    stdlib = set(sys.stdlib_module_names)
    return {m for m in found if m not in stdlib and m not in {"recovery_ext", "recovery_pipelines", "__future__"}}


def test_the_core_declares_only_what_the_library_imports_and_every_import_is_declared():
    core, extras = _requirements()
    imported = {DISTRIBUTION.get(m, m.replace("_", "-")).lower() for m in _third_party_imports(ROOT / "recovery_ext")}
    # pydantic comes with dagster (ConfigurableResource is pydantic); sqlalchemy's postgresql dialect is in sqlalchemy
    provided_by_core = {"pydantic"}
    optional = set().union(*extras.values())
    assert imported - core - provided_by_core - optional == set()
    assert not core & HEAVY
    # OpenTelemetry is opt-in: the library imports it, only its API, and declares it in the extra alone
    assert "opentelemetry-api" in imported
    assert extras["otel"] == {"opentelemetry-api"}
    assert not {name for name in core if name.startswith("opentelemetry")}


def test_the_pipelines_declare_their_stack_in_an_extra():
    _, extras = _requirements()
    imported = {DISTRIBUTION.get(m, m.replace("_", "-")).lower()
                for m in _third_party_imports(ROOT / "recovery_pipelines")}
    assert {"openai", "rapidocr-onnxruntime", "pypdfium2", "pillow"} <= extras["pipelines"]
    core, _ = _requirements()
    assert imported - core - extras["pipelines"] - {"pydantic", "dagster-graphql"} == set()
    assert "dagster-graphql" in extras["webserver"]
