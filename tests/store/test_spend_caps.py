"""Spend caps in the store, on SQLite and PostgreSQL: reservations against a cap, settling, fencing, the
configuration against an operator's change, and the pause shown on the pipeline."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import update

from recovery_ext._errors import ConfigurationError, NotFound, OwnershipLost
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import ProviderCall
from recovery_ext._store.schema import pipelines
from recovery_ext._store.models import SpendCaps, deployment_scope, pipeline_scope
from recovery_ext._store.models import WaitKind


def _pipeline(store, run="run-1"):
    return store.pipelines.create_pipeline("job", ["a"], owner=run, origin_run_id=run)


def test_a_cap_grants_what_fits_and_refuses_the_rest_until_settled(store):
    own = _pipeline(store)
    scopes = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=300))
    assert scopes == [pipeline_scope(own.pipeline_id)]
    first = store.providers.spend_reserve(own, scopes, tokens=200)
    assert first.granted
    refused = store.providers.spend_reserve(own, scopes, tokens=200)
    assert not refused.granted and refused.full.reserved_tokens == 200 and refused.full.left_tokens == 100
    assert "200 reserved" in refused.full.describe(200)
    # the answer cost less than its estimate: the rest comes back
    store.providers.spend_settle(first.reservations, tokens=80, cost=None)
    store.providers.spend_settle(first.reservations, tokens=80, cost=None)  # twice counts once
    cap = store.providers.spend_cap(scopes[0])
    assert (cap.spent_tokens, cap.reserved_tokens, cap.left_tokens) == (80, 0, 220)
    assert store.providers.spend_reserve(own, scopes, tokens=200).granted


def test_pipeline_and_deployment_caps_are_taken_all_or_none(store):
    own = _pipeline(store)
    other = _pipeline(store, "run-2")
    caps = SpendCaps(pipeline_tokens=1000, deployment_cost=1.0)
    scopes = store.providers.spend_configure(own, caps)
    deployment = store.pipelines.get_pipeline(own.pipeline_id).deployment
    assert scopes == [pipeline_scope(own.pipeline_id), deployment_scope(deployment)]
    other_scopes = store.providers.spend_configure(other, caps)
    assert store.providers.spend_reserve(other, other_scopes, tokens=10, cost=0.75).granted
    refused = store.providers.spend_reserve(own, scopes, tokens=10, cost=0.5)
    assert refused.full.scope == deployment_scope(deployment)
    # the pipeline's own cap gave nothing back half-taken
    assert store.providers.spend_cap(scopes[0]).reserved_tokens == 0


def test_a_superseded_owner_reserves_nothing(store):
    own = _pipeline(store)
    scopes = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=1000))
    with store.write() as conn:  # a take-over's new epoch
        conn.execute(update(pipelines).where(pipelines.c.id == own.pipeline_id).values(epoch=own.epoch + 1))
    with pytest.raises(OwnershipLost):
        store.providers.spend_reserve(own, scopes, tokens=10)
    assert store.providers.spend_cap(scopes[0]).reserved_tokens == 0


def test_an_operators_raise_stands_until_the_configuration_itself_changes(store):
    own = _pipeline(store)
    scope = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=100))[0]
    store.providers.spend_cap_set(scope, tokens=500, who="ops")
    store.providers.spend_configure(own, SpendCaps(pipeline_tokens=100))  # a resume with the same configuration
    assert store.providers.spend_cap(scope).max_tokens == 500
    store.providers.spend_configure(own, SpendCaps(pipeline_tokens=200))  # a changed configuration
    cap = store.providers.spend_cap(scope)
    assert (cap.max_tokens, cap.changed_by) == (200, "configuration")
    with pytest.raises(NotFound):
        store.providers.spend_cap_set("pipeline:999999", tokens=1)
    with pytest.raises(ConfigurationError):
        store.providers.spend_cap_set(scope, tokens=-1)


def test_set_makes_a_cap_for_a_pipeline_with_none_and_it_holds_whatever_the_configuration(store):
    own = _pipeline(store)
    scope = pipeline_scope(own.pipeline_id)
    assert store.providers.spend_cap(scope) is None and not store.providers.spend_caps_over(own.pipeline_id)
    made = store.providers.spend_cap_set(scope, tokens=300, who="ops")
    assert (made.max_tokens, made.max_cost, made.spent_tokens, made.changed_by) == (300, None, 0, "ops")
    assert store.providers.spend_caps_over(own.pipeline_id)
    # a configuration with no cap at all: the operator's cap is still taken
    assert store.providers.spend_configure(own, SpendCaps()) == [scope]
    assert store.providers.spend_reserve(own, [scope], tokens=200).granted
    assert not store.providers.spend_reserve(own, [scope], tokens=200).granted
    # a configured cap's first look keeps the operator's limit and only fills in the kind it left open
    store.providers.spend_configure(own, SpendCaps(pipeline_tokens=1000, pipeline_cost=2.0))
    cap = store.providers.spend_cap(scope)
    assert (cap.max_tokens, cap.max_cost, cap.changed_by, cap.reserved_tokens) == (300, 2.0, "ops", 200)
    # set again replaces, never duplicates
    assert store.providers.spend_cap_set(scope, tokens=None).max_tokens is None
    assert [c.scope for c in store.providers.spend_caps()] == [scope]


def test_a_cap_an_operator_sets_on_a_deployment_holds_its_pipelines(store):
    own = _pipeline(store)
    deployment = store.pipelines.get_pipeline(own.pipeline_id).deployment
    store.providers.spend_cap_set(deployment_scope(deployment), cost=1.0, who="ops")
    assert store.providers.spend_caps_over(own.pipeline_id)
    scopes = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=100))
    assert scopes == [pipeline_scope(own.pipeline_id), deployment_scope(deployment)]
    assert store.providers.spend_reserve(own, scopes, tokens=10, cost=1.5).full.scope == deployment_scope(deployment)


@pytest.mark.parametrize("scope, says", [("pipeline:999999", "no pipeline 999999"),
                                         ("deployment:nowhere", "no deployment 'nowhere'"),
                                         ("elsewhere:1", "pipeline:ID or deployment:NAME")])
def test_set_on_what_does_not_exist_is_not_found_and_makes_nothing(store, scope, says):
    _pipeline(store)
    with pytest.raises(NotFound, match=says):
        store.providers.spend_cap_set(scope, tokens=1)
    assert store.providers.spend_caps() == []


def test_a_jobs_reservation_is_settled_by_whoever_collects_it(store):
    own = _pipeline(store)
    scopes = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=1000, pipeline_cost=10.0))
    store.providers.spend_reserve(own, scopes, tokens=600, cost=3.0, ref="token-1")
    assert store.providers.spend_settle_ref("token-1", tokens=450, cost=2.5) == 1
    assert store.providers.spend_settle_ref("token-1", tokens=450, cost=2.5) == 0
    cap = store.providers.spend_cap(scopes[0])
    assert (cap.spent_tokens, cap.reserved_tokens, cap.spent_cost, cap.reserved_cost) == (450, 0, 2.5, 0.0)


def test_the_pause_at_the_cap_is_shown_and_cleared(store):
    own = _pipeline(store)
    assert store.providers.show_wait(own, 5.0, "pipeline:1: 100 of 100 tokens spent", kind=WaitKind.SPEND_CAP,
                                     node="n")
    row = store.pipelines.get_pipeline(own.pipeline_id)
    assert row.shown_status == "waiting" and row.waiting_reason.startswith("spend cap: ")
    assert not store.providers.clear_wait(own, kind=WaitKind.PROVIDER_JOB, node="n")  # not that wait
    assert store.providers.clear_wait(own, kind=WaitKind.SPEND_CAP, node="n")
    assert store.pipelines.get_pipeline(own.pipeline_id).waiting_until is None


@pytest.mark.parametrize("bad", [{"pipeline_tokens": -1}, {"pipeline_cost": float("nan")},
                                 {"deployment_tokens": 1.5}, {"poll_seconds": 0}])
def test_bad_caps_are_refused_with_a_clear_error(bad):
    with pytest.raises(ConfigurationError):
        SpendCaps(**bad)


def test_a_dead_owners_reservation_is_settled_by_the_ledger_once_its_outcome_is_known(store):
    own = _pipeline(store)
    scope = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=10_000))[0]
    # three reservations of a process later killed, each naming its call's ledger row (as the guard does)
    answered, refused, unknown = (ProviderCall(endpoint="https://llm.example", model="m", tokens_in=300,
                                               tokens_out=100, cost=0.5),
                                  ProviderCall(endpoint="https://llm.example", model="m", outcome="server_error"),
                                  ProviderCall(endpoint="https://llm.example", model="m", outcome=IN_FLIGHT))
    for call in (answered, refused, unknown):
        assert store.providers.spend_reserve(own, [scope], tokens=1000, cost=2.0, ref=call.id).granted
    rows = [replace(c, pipeline_id=own.pipeline_id, node_name="a", run_id=own.owner, epoch=own.epoch)
            for c in (answered, refused, unknown)]
    store.providers.record_provider_calls(rows)
    store.providers.spend_configure(own, SpendCaps(pipeline_tokens=10_000))  # the live owner: nothing settled
    assert store.providers.spend_cap(scope).reserved_tokens == 3000
    with store.write() as conn:  # taken over: the reservations' owner is dead
        conn.execute(update(pipelines).where(pipelines.c.id == own.pipeline_id).values(epoch=own.epoch + 1))
    resumed = replace(own, epoch=own.epoch + 1)
    store.providers.spend_configure(resumed, SpendCaps(pipeline_tokens=10_000))  # the resume's node starts
    cap = store.providers.spend_cap(scope)
    # the answered call counts what the ledger recorded, the refused one nothing, the unknown one stays reserved
    assert (cap.spent_tokens, cap.spent_cost, cap.reserved_tokens, cap.reserved_cost) == (400, 0.5, 1000, 2.0)


def test_a_dead_owners_reservation_for_a_request_that_never_left_is_released(store):
    """A new user's trial: 18 tasks of an ``amap`` had reserved and were waiting to write their calls' ledger rows
    when the process was killed; their reservations stayed "reserved" for good after the resume completed. A
    journaled request's ledger row and a job's intent are written, fenced, before they are sent, so a dead
    owner's reservation naming neither never left; one with no name (``ref``) may have, and stays."""
    own = _pipeline(store)
    store.pipelines.start_node(own, "a")
    scope = store.providers.spend_configure(own, SpendCaps(pipeline_tokens=10_000, deployment_tokens=10_000))[0]
    never_sent = ProviderCall(endpoint="https://llm.example", model="m")  # its row was never written
    job_token = "job-token-1"
    for ref in (never_sent.id, job_token, None):
        assert store.providers.spend_reserve(own, [scope], tokens=1000, cost=0.1, ref=ref).granted
    submission = replace(ProviderCall(endpoint="https://batch.example", model="m", outcome=IN_FLIGHT),
                         pipeline_id=own.pipeline_id, node_name="a", run_id=own.owner, epoch=own.epoch)
    store.pipelines.job_submitting(own, "a", token=job_token, provider="openai", items=["x"], attempt=1,
                                   call=submission)
    store.providers.spend_configure(own, SpendCaps(pipeline_tokens=10_000))  # its own owner: nothing released
    assert store.providers.spend_cap(scope).reserved_tokens == 3000
    with store.write() as conn:  # taken over: the reservations' owner is dead
        conn.execute(update(pipelines).where(pipelines.c.id == own.pipeline_id).values(epoch=own.epoch + 1))
    resumed = replace(own, epoch=own.epoch + 1)
    live = ProviderCall(endpoint="https://llm.example", model="m")  # the new owner's, its row not written yet
    assert store.providers.spend_reserve(resumed, [scope], tokens=500, ref=live.id).granted
    store.providers.spend_configure(resumed, SpendCaps(pipeline_tokens=10_000))  # the resume's next node starts
    cap = store.providers.spend_cap(scope)
    # the job's reservation waits for its results, the unnamed one may have been sent, the live one is live
    assert (cap.spent_tokens, cap.reserved_tokens, cap.spent_cost) == (0, 2500, 0.0)
    assert cap.reserved_cost == pytest.approx(0.2)
    assert store.providers.spend_settle_ref(job_token, tokens=0, cost=None) == 1
    store.providers.spend_release(store.providers.spend_reserve(resumed, [scope], tokens=1, cost=0.1).reservations)
    assert store.providers.spend_cap(scope).reserved_cost == pytest.approx(0.1)


def test_money_reserved_and_settled_again_leaves_no_rounding_reserved(store):
    """0.3 + 0.1 + 0.2 - 0.3 - 0.1 - 0.2 is 8.3e-17 in floats: the trial saw "reserved 1.6263e-19" on finished
    pipelines."""
    own = _pipeline(store)
    scope = store.providers.spend_configure(own, SpendCaps(pipeline_cost=10.0))[0]
    grants = [store.providers.spend_reserve(own, [scope], tokens=1, cost=cost) for cost in (0.3, 0.1, 0.2)]
    for grant in grants:
        store.providers.spend_settle(grant.reservations, tokens=1, cost=0.05)
    cap = store.providers.spend_cap(scope)
    assert (cap.reserved_tokens, cap.reserved_cost) == (0, 0.0)
