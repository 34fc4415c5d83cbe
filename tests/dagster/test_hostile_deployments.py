"""Hostile deployments, round three: names are validated; a pipeline is resumed only by the instance that holds
its first run; a renamed deployment adopts its pipelines or says loudly what it cannot."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, DagsterRunStatus, build_sensor_context, instance_for_test
from dagster._core.test_utils import create_run_for_test

from e2e_defs import items_job
from helpers import expire

from recovery_ext import ConfigurationError, RecoveryResource, make_orphan_sensor
from recovery_ext._cli import main
from recovery_ext._dagster.resources import DEPLOYMENT_ENV
from recovery_ext._store import recovery as store_recovery


@pytest.mark.parametrize("name", ["a\x00b", "x" * (1 << 20), "", " blue", "blue/green", "-blue", "x" * 65,
                                  "blü", "blue\n"], ids=lambda n: repr(n[:12]))
def test_a_bad_deployment_name_is_refused_in_one_line_when_built(name, monkeypatch):
    with pytest.raises(ValueError, match=r"deployment must be 1 to 64 letters, digits") as info:
        RecoveryResource(deployment=name)
    assert len(str(info.value)) < 600  # a 1 MB name is not echoed back
    if name and "\x00" not in name:  # empty means "not set"; no environment variable can hold a NUL
        monkeypatch.setenv(DEPLOYMENT_ENV, name)
        with DagsterInstance.ephemeral() as instance, pytest.raises(ConfigurationError, match=DEPLOYMENT_ENV):
            RecoveryResource().deployment_name(instance)


def test_the_store_refuses_a_bad_deployment_name_on_both_databases(store):
    with pytest.raises(ConfigurationError, match="deployment must be"):
        store.pipelines.create_pipeline("job", ["a"], owner="r", origin_run_id="r", deployment="blue\x00")
    assert store.reports.list_pipelines() == []
    assert (
        store.pipelines.create_pipeline("job", ["a"], owner="r", origin_run_id="r", deployment="blue-2.eu_1").epoch == 1
    )


# -- only the instance holding the first run acts; a renamed deployment's orphans --------------------------

def _crashed(store, instance, deployment, **tags):
    run = create_run_for_test(instance, job_name="items_job", status=DagsterRunStatus.STARTED, tags=tags)
    own = store.pipelines.create_pipeline("items_job", ["a", "b"], owner=run.run_id, origin_run_id=run.run_id,
                                deployment=deployment, params={"ops": {"a": {"config": {"api_key": "sk-real-key"}}}})
    store.pipelines.start_node(own, "a")
    expire(store, own.pipeline_id)
    return own


def tick(instance, db_url, deployment, **settings):
    sensor = make_orphan_sensor([items_job], minimum_interval_seconds=1)
    return sensor.evaluate_tick(build_sensor_context(instance=instance, resources={
        "recovery": RecoveryResource(database_url=db_url, deployment=deployment, **settings)}))


def test_two_instances_sharing_a_deployment_name_resume_a_crash_once_from_the_one_holding_its_first_run(store,
                                                                                                      db_url):
    with instance_for_test() as mine, instance_for_test() as theirs:
        own = _crashed(store, mine, "blue", team="search")
        aside = tick(theirs, db_url, "blue")
        assert not aside.run_requests
        assert "stands aside for 1 pipeline of deployment 'blue' whose first run this Dagster instance does not " \
               "hold" in aside.skip_message and f"pipeline {own.pipeline_id}" in aside.skip_message
        assert (
            store.pipelines.get_pipeline(own.pipeline_id).epoch,
            store.pipelines.get_pipeline(own.pipeline_id).resume_count,
        ) == (1, 0)
        (request,) = tick(mine, db_url, "blue").run_requests
        assert request.tags["team"] == "search"
        # reserved for a sensor of the same name: the other instance, with no such run, never re-requests it
        again = tick(theirs, db_url, "blue")
        assert not again.run_requests and "stands aside" in again.skip_message
        assert store.pipelines.get_pipeline(own.pipeline_id).resume_count == 1


def test_a_renamed_deployment_adopts_the_crashed_pipelines_whose_first_run_its_instance_holds(store, db_url):
    with instance_for_test() as mine:
        own = _crashed(store, mine, "blue", team="search")
        (request,) = tick(mine, db_url, "green").run_requests  # RECOVERY_DEPLOYMENT renamed blue -> green
        assert request.tags["team"] == "search"
        adopted = store.pipelines.get_pipeline(own.pipeline_id)
        assert (adopted.deployment, adopted.resume_count) == ("green", 1)


def test_recover_after_a_rename_leaves_no_pipeline_without_a_launcher(store, db_url, monkeypatch):
    """`recover` run by hand after blue -> green reclaims blue's crash; green's sensor, whose instance holds the
    first run, then requests its resume with the first run's tags: nothing is stranded without a launcher."""
    with instance_for_test() as mine:
        own = _crashed(store, mine, "blue", team="search")
        monkeypatch.setenv(DEPLOYMENT_ENV, "green")
        recovered = CliRunner().invoke(main, ["--database-url", db_url, "--json", "recover"])
        assert recovered.exit_code == 0, recovered.output
        assert own.pipeline_id in json.loads(recovered.stdout)["reclaimed_pipelines"]
        (request,) = tick(mine, db_url, "green").run_requests
        assert request.tags["team"] == "search"
        adopted = store.pipelines.get_pipeline(own.pipeline_id)
        assert adopted.deployment == "green" and adopted.resume_count == 1
        # no run was launched here (evaluate_tick only asks), so the next tick asks again under the same run key,
        # which Dagster launches once
        assert [r.run_key for r in tick(mine, db_url, "green").run_requests] == [request.run_key]


def test_a_stranded_orphan_of_another_deployment_is_reported_in_the_tick_and_in_status(store, db_url):
    with instance_for_test() as mine, instance_for_test() as other:
        own = _crashed(store, mine, "blue")
        expire(store, own.pipeline_id, ago=700)  # nobody reclaimed it for longer than any launch grace
        told = tick(other, db_url, "green", launch_grace_seconds=60)
        assert not told.run_requests and store.pipelines.get_pipeline(own.pipeline_id).deployment == "blue"
        assert "1 orphaned pipeline of other deployments" in told.skip_message
        assert f"{own.pipeline_id} (blue)" in told.skip_message
        status = CliRunner().invoke(main, ["--database-url", db_url, "status"])
        assert status.exit_code == 0
        assert f"pipeline {own.pipeline_id} (items_job) of deployment 'blue' is stranded" in status.output
        as_json = json.loads(CliRunner().invoke(main, ["--database-url", db_url, "--json", "status"]).stdout)
        assert [s["id"] for s in as_json["stranded_pipelines"]] == [own.pipeline_id]


def test_a_pipeline_past_the_ticks_check_limit_waits_for_a_later_tick_and_is_never_acted_on_unchecked(
        store, db_url, monkeypatch):
    monkeypatch.setattr(store_recovery, "FIRST_RUNS_LIMIT", 2)
    with instance_for_test() as mine, instance_for_test() as theirs:
        crashed = [_crashed(store, mine, "blue").pipeline_id for _ in range(3)]
        assert not tick(theirs, db_url, "blue").run_requests  # checks 2, the third is not acted on either
        assert [store.pipelines.get_pipeline(i).resume_count for i in crashed] == [0, 0, 0]
        first = tick(mine, db_url, "blue").run_requests
        assert len(first) == 2 and sorted(store.pipelines.get_pipeline(i).resume_count for i in crashed) == [0, 1, 1]
        second = tick(mine, db_url, "blue").run_requests  # the third, checked now (and a re-request)
        assert {r.run_key for r in [*first, *second]} == {f"recovery-{i}-1" for i in crashed}
        assert [store.pipelines.get_pipeline(i).resume_count for i in crashed] == [1, 1, 1]
