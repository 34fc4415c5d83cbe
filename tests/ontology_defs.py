"""The real ontology job with the multiprocess executor, bound to resources from the environment (for reconstructable)."""

from __future__ import annotations

import os

from dagster import Definitions

from recovery_ext.integration import RecoveryResource
from recovery_ext.pipelines.llm import LLMResource
from recovery_ext.pipelines.ontology import SourceDatabase, make_ontology_job

defs = Definitions(
    jobs=[make_ontology_job()],
    resources={"recovery": RecoveryResource(heartbeat_interval=1, heartbeat_timeout=60), "llm": LLMResource(),
               "source": SourceDatabase(url=os.environ.get("ONTOLOGY_TEST_SOURCE", "sqlite://"))},
)


def bound_ontology_job():
    return defs.get_job_def("ontology_extraction")
