"""The real ontology job with the multiprocess executor, bound to resources from the environment (for
reconstructable)."""

from __future__ import annotations

import os

from dagster import Definitions

from recovery_ext import RecoveryResource
from recovery_pipelines.llm import LLMResource
from recovery_pipelines.ontology import SourceDatabase, make_ontology_job
from recovery_pipelines.ontology_schema import MIGRATIONS

defs = Definitions(
    jobs=[make_ontology_job()],
    resources={"recovery": RecoveryResource(heartbeat_interval=1, heartbeat_timeout=60,
                                                    migration_packages=[MIGRATIONS]), "llm": LLMResource(),
               "source": SourceDatabase(url=os.environ.get("ONTOLOGY_TEST_SOURCE", "sqlite://"))},
)


def bound_ontology_job():
    return defs.get_job_def("ontology_extraction")
