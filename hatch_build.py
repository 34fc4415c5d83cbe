"""The wheel registers only the CLI commands of packages it ships.

The demo pipelines (``recovery_pipelines``) stay in the repository: an editable install from a clone imports them
from there and registers ``recovery-ext demo``; a wheel, or a path install (built as a wheel), ships the library
alone and registers no command it cannot load.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

COMMANDS = "recovery_ext.commands"


class ShippedCommandsOnly(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        shipped = {package.split("/")[0] for package in self.build_config.packages}
        commands = self.metadata.core.entry_points.get(COMMANDS, {})
        for name, target in list(commands.items()):
            if target.split(":")[0].split(".")[0] not in shipped:
                del commands[name]
        if not commands:
            self.metadata.core.entry_points.pop(COMMANDS, None)
