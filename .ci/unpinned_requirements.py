"""Print what the tests need beside the library, without the Dagster integrations.

Every requirement of the extras (the test tools of `dev` included), except the Dagster family's integrations
(dagster-webserver, dagster-postgres, dagster-celery, ...): each of those pins the dagster release it was made
with, so installing one would move dagster off what a library-only install resolves. The docs tools are left
out too (no test needs them)."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
wanted = set()
for extra, requirements in project["optional-dependencies"].items():
    if extra == "docs":
        continue
    for text in requirements:
        requirement = Requirement(text)
        if requirement.name != project["name"] and not requirement.name.startswith("dagster"):
            wanted.add(str(requirement))
print("\n".join(sorted(wanted)))
