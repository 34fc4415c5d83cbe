"""The Dagster entry point: `dagster dev -w workspace.yaml` loads this file."""

from recovery_pipelines.assembly import build_definitions

defs = build_definitions()
