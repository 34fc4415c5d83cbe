"""`make demo-crash` judges a pipeline once its resume runs have ended, not at its polling deadline before them."""

from __future__ import annotations

from types import SimpleNamespace

from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_pipelines.demo_crash import Outcome, record_verdict


class ResumeStillRunning:
    """The runs `dagster dev` knows of: a first run and its resume, which ends (completing the pipeline) only while
    the demo waits for it."""

    def __init__(self, store, own) -> None:
        self.store, self.own, self.waited = store, own, []

    def runs(self, tags=None, job_name=None):
        first = SimpleNamespace(run_id="run-1", tags={TAG_PIPELINE: str(self.own.pipeline_id)})
        resume = SimpleNamespace(run_id="resume-1", tags={TAG_PIPELINE: str(self.own.pipeline_id),
                                                          TAG_RESUME_NUMBER: "1"})
        return [first, resume]

    def wait_run(self, run_id, statuses, timeout):
        self.waited.append(run_id)
        self.store.pipelines.complete_node(self.own, "a", {"done": True})


def test_a_resume_still_running_at_the_deadline_is_waited_for_before_its_pipeline_is_judged(store):
    own = store.pipelines.create_pipeline("ontology_extraction", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "a")
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "running"  # at the polling deadline
    dev = ResumeStillRunning(store, own)
    outcome = Outcome()
    record_verdict(outcome, store, {"ontology_extraction": store.pipelines.get_pipeline(own.pipeline_id)}, dev)
    assert dev.waited == ["resume-1"]
    assert outcome.final_status == {"ontology_extraction": "completed"}
    assert (outcome.resumes, outcome.runs) == ({"ontology_extraction": 1}, {"ontology_extraction": 2})
