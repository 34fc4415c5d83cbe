"""MkDocs hook: the settings reference is generated from the settings' own descriptions.

A page line ``<!-- settings-table: recovery_ext.RecoveryResource -->`` becomes a table of that
pydantic model's fields (name, type, default, description), so the reference cannot drift from
the code.
"""

from __future__ import annotations

import importlib
import re

MARKER = re.compile(r"^<!-- settings-table: ([\w.]+) -->$", re.MULTILINE)


def _default(field) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    return f"`{field.default!r}`"


def _type(annotation) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("Optional", "optional ")


def settings_table(path: str) -> str:
    module, _, name = path.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    rows = ["| Setting | Type | Default | What it does |", "|---|---|---|---|"]
    for field_name, field in model.model_fields.items():
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{field_name}` | `{_type(field.annotation)}` | {_default(field)} | {description} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: settings_table(m.group(1)), markdown)
