"""Hostile settings, round three: every value accepted when built is one both databases store and agree on.

Budget limits fit their columns (a PostgreSQL INTEGER for requests, BIGINT sums for tokens); durations,
even with ``allow_long_durations``, lead to times both databases can hold.
"""

from __future__ import annotations

import sys

import pytest

from recovery_ext import ConfigurationError, RecoveryResource
from recovery_ext._settings import LONGEST
from recovery_ext._store.models import ProviderLimits, LIMIT_MAXIMUM
from recovery_ext._store.models import PipelineLimits
import store_rows


@pytest.mark.parametrize("limits", [dict(requests_per_minute=2**31), dict(requests_per_minute=sys.maxsize + 1),
                                    dict(tokens_per_minute=10**30), dict(tokens_per_minute=sys.maxsize + 1),
                                    dict(requests_per_minute=10**30)], ids=repr)
def test_provider_limits_beyond_what_the_columns_hold_are_refused_when_built(limits):
    with pytest.raises(ConfigurationError, match=r"must be a whole number from 1 to \d+"):
        ProviderLimits(**limits)


def test_the_largest_accepted_limits_reserve_and_settle_on_both_databases(store):
    limits = ProviderLimits(requests_per_minute=LIMIT_MAXIMUM["requests_per_minute"],
                            tokens_per_minute=LIMIT_MAXIMUM["tokens_per_minute"])
    grants = [store.providers.budget_reserve("http://e/v1", "m", tokens=LIMIT_MAXIMUM["tokens_per_minute"] // 2,
                                   limits=limits) for _ in range(3)]
    assert [g.granted for g in grants] == [True, True, False]  # the third would pass the limit, no overflow
    store.providers.budget_settle(grants[0].reservation, 2**40)
    [budget] = store_rows.budgets(store)
    assert budget["requests_per_minute"] == 2**31 - 1


@pytest.mark.parametrize("seconds", [1e12, LONGEST * 1.01, 2.6e11])
def test_a_deadline_past_what_both_databases_store_is_refused_even_when_long_durations_are_allowed(seconds):
    # pydantic wraps the resource's ConfigurationError in its ValidationError (a ValueError), one line kept
    with pytest.raises(ValueError, match=r"hard_deadline_seconds must be at most .* \(a century\)"):
        RecoveryResource(hard_deadline_seconds=seconds, allow_long_durations=True)
    with pytest.raises(ConfigurationError, match=r"deadline_seconds must be at most"):
        PipelineLimits(deadline_seconds=seconds)
    with pytest.raises(ValueError, match=r"launch_grace_seconds must be at most"):
        RecoveryResource(launch_grace_seconds=seconds, allow_long_durations=True)


@pytest.mark.parametrize("name", ["event_retention_seconds", "finished_pipeline_retention_seconds"])
def test_retention_past_ten_years_is_lifted_by_allow_long_durations_as_its_error_says(name):
    """A hostile trial: the error said to set allow_long_durations, which these two settings then ignored."""
    with pytest.raises(ValueError, match=rf"{name} must be at most .* \(set allow_long_durations to go beyond\)"):
        RecoveryResource(**{name: 20 * 366 * 86400.0})
    assert getattr(RecoveryResource(**{name: 20 * 366 * 86400.0}, allow_long_durations=True), name) > 6e8
    with pytest.raises(ValueError, match=rf"{name} must be at most .* \(a century\)"):
        RecoveryResource(**{name: 1e300}, allow_long_durations=True)


def test_a_launch_grace_past_a_day_is_lifted_by_allow_long_durations_as_its_error_says():
    """A review found it: the recovery settings checked the grace first, against a day, with no way to lift it."""
    with pytest.raises(ValueError, match=r"launch_grace_seconds must be at most 86400 s "
                                         r"\(set allow_long_durations to go beyond\), got 172800"):
        RecoveryResource(launch_grace_seconds=2 * 86400.0)
    resource = RecoveryResource(launch_grace_seconds=2 * 86400.0, allow_long_durations=True)
    assert resource.recovery_settings().launch_grace_seconds == 2 * 86400.0


def test_a_limit_nothing_lifts_gives_no_advice_to_lift_it():
    from recovery_ext import LLMResource

    with pytest.raises(ValueError) as refused:
        RecoveryResource(retry_initial_delay=7200.0)
    assert "retry_initial_delay must be at most 3600 s, got 7200" in str(refused.value)
    assert "allow_long_durations" not in str(refused.value)
    with pytest.raises(ValueError) as refused:
        LLMResource(model="m", timeout=10 * 86400.0)
    assert "must be at most 86400 s, got" in str(refused.value) and "allow_long" not in str(refused.value)


def test_the_longest_accepted_deadline_keeps_a_live_pipeline_on_both_databases(store):
    assert RecoveryResource(hard_deadline_seconds=LONGEST, allow_long_durations=True).hard_deadline_seconds == LONGEST
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1",
                                limits=PipelineLimits(heartbeat_timeout=LONGEST, deadline_seconds=LONGEST))
    assert store.recovery.find_orphans() == []  # no corrupt row on SQLite, no orphan on PostgreSQL: both agree
    pipeline = store.pipelines.get_pipeline(own.pipeline_id)
    assert pipeline.status == "running" and pipeline.deadline.year > 2100


# -- attacking the bounds themselves: integers beyond any float ------------------------------------------------

def test_an_integer_beyond_any_float_is_a_configuration_error_everywhere():
    from recovery_ext import Prices
    from recovery_ext._settings import check_seconds

    huge = 10**400
    with pytest.raises(ConfigurationError, match="finite number of seconds"):
        check_seconds("heartbeat_interval", huge)
    with pytest.raises(ConfigurationError, match="per million tokens"):
        Prices.parse({"m": {"input": huge}})
    with pytest.raises(ConfigurationError, match="margin_seconds"):
        ProviderLimits(requests_per_minute=1, margin_seconds=huge)
    with pytest.raises(ConfigurationError, match="deadline_seconds must be at most") as info:
        PipelineLimits(deadline_seconds=huge)
    assert len(str(info.value)) < 200


def test_a_usage_object_whose_attributes_raise_is_read_as_unknown():
    from recovery_ext import read_usage

    class Hostile:
        @property
        def prompt_tokens(self):
            raise RuntimeError("boom")

        completion_tokens = 4

    usage = read_usage(Hostile())
    assert (usage.tokens_in, usage.tokens_out) == (0, 4) and "prompt_tokens" in usage.note
