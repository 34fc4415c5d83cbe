"""Hostile deployments, round three: names are validated; a pipeline is resumed only by the instance that holds
its first run; a renamed deployment adopts its pipelines or says loudly what it cannot."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance

from recovery_ext import ConfigurationError, RecoveryResource
from recovery_ext._dagster.resources import DEPLOYMENT_ENV


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
        store.create_pipeline("job", ["a"], owner="r", origin_run_id="r", deployment="blue\x00")
    assert store.list_pipelines() == []
    assert store.create_pipeline("job", ["a"], owner="r", origin_run_id="r", deployment="blue-2.eu_1").epoch == 1
