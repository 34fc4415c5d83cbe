"""What the provider-job tests check after a run against the Batch API stand-in: the ledger's figures equal
what the stand-in counted."""

from __future__ import annotations

from collections import Counter

from recovery_pipelines.batch_stand_in import BatchProvider
import store_rows


def outcomes(store, pipeline_id) -> Counter:
    return Counter(c.outcome for c in store_rows.provider_calls(store, pipeline_id))


def assert_ledger_equals_the_provider(store, pipeline_id, provider: BatchProvider, items: int | None):
    """Tokens, answered calls and submissions as the stand-in counted them; each of ``items`` answered once (the
    items t00, t01, ...: their custom_ids; None: a stand-in whose custom_ids are not the item keys)."""
    answered = provider.answered()
    f = store.reports.provider_costs(pipeline_id).pipelines[pipeline_id]
    assert (f.tokens_in, f.tokens_out) == (sum(a[1] for a in answered), sum(a[2] for a in answered))
    calls = outcomes(store, pipeline_id)
    assert calls["ok"] == len(answered)
    assert calls["submitted"] + calls["resubmitted"] == provider.submissions
    if items is not None:
        assert Counter(a[0] for a in answered) == Counter(f"t{i:02d}" for i in range(items))
    return f
