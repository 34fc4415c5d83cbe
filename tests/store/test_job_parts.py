"""A provider job submitted part by part (``submit_by_parts``: one request per item, no idempotency key) records,
while it is submitting, each part as the provider accepts it and the one whose submission is on its way: fenced
by the owner's epoch, read back by a resume (``job_live``), the part a crash lost ledgered once."""

from __future__ import annotations

import pytest

from helpers import expire, reclaim
import store_rows

from recovery_ext._errors import OwnershipLost
from recovery_ext._providers.jobs import UNFINDABLE
from recovery_ext._store.models import PassPlan, ProviderCall


def batch_call(own, outcome="in_flight", note=None) -> ProviderCall:
    return ProviderCall(endpoint="http://127.0.0.1:9/v1", outcome=outcome, operation="batch", note=note,
                        pipeline_id=own.pipeline_id, node_name="a", run_id=own.owner, epoch=own.epoch)


def test_each_part_is_recorded_read_back_by_a_resume_and_the_lost_one_ledgered_once(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1", params={})
    store.pipelines.start_node(own, "a")
    store.pipelines.job_submitting(own, "a", token="t" * 32, provider="azure-document", items=["d0", "d1", "d2"],
                                   attempt=1, call=batch_call(own))
    store.pipelines.job_part(own, "a", "t" * 32, "d0", None)
    store.pipelines.job_part(own, "a", "t" * 32, "d0", "r0")
    store.pipelines.job_part(own, "a", "t" * 32, "d1", None)  # the kill comes while d1's request is out
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=1))
    new = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    live = store.pipelines.job_live(new, "a", "azure-document")
    assert (live.job_id, dict(live.accepted), live.sending) == (None, {"d0": "r0"}, "d1")
    with pytest.raises(OwnershipLost):  # the superseded worker's next part is refused: it sends nothing more
        store.pipelines.job_part(own, "a", "t" * 32, "d1", "r1")
    lost = batch_call(new, UNFINDABLE, "'d1' may have been submitted twice")
    store.pipelines.job_part_lost(new, "a", "t" * 32, "d1", lost)
    store.pipelines.job_part_lost(new, "a", "t" * 32, "d1", batch_call(new, UNFINDABLE))  # a second resume's
    assert [c.outcome for c in store_rows.provider_calls(store, own.pipeline_id)].count(UNFINDABLE) == 1
    again = store.pipelines.job_live(new, "a", "azure-document")
    assert (dict(again.accepted), again.sending) == ({"d0": "r0"}, None)
    for item, part in (("d1", None), ("d1", "r1b"), ("d2", None), ("d2", "r2")):
        store.pipelines.job_part(new, "a", "t" * 32, item, part)
    store.pipelines.job_submitted(new, "a", "t" * 32, '{"d0":"r0","d1":"r1b","d2":"r2"}', outcome="submitted")
    (job,) = store.pipelines.provider_jobs(own.pipeline_id)
    assert (job.status, dict(job.accepted), job.sending) == ("submitted", {"d0": "r0", "d1": "r1b", "d2": "r2"}, None)
    with pytest.raises(LookupError):  # a job no longer submitting takes no parts
        store.pipelines.job_part(new, "a", "t" * 32, "d3", None)
