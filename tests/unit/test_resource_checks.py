"""The resource's settings are checked once per configuration, yet a bad value is refused at every build."""

from __future__ import annotations

import pydantic
import pytest

from recovery_ext import RecoveryResource
from recovery_ext._dagster import resources


@pytest.fixture
def checks(monkeypatch):
    """Counts the resource's settings checks, with no configuration checked yet in this process."""
    monkeypatch.setattr(resources, "_checked_configs", {})
    seen: list[float] = []
    check = RecoveryResource._check_settings

    def counted(self):
        seen.append(self.heartbeat_timeout)
        return check(self)

    monkeypatch.setattr(RecoveryResource, "_check_settings", counted)
    return seen


def test_one_configuration_built_again_is_checked_once(checks, tmp_path):
    url = f"sqlite:///{tmp_path}/a.db"
    for _ in range(3):  # what a sensor's ticks do: the same config, built again each time
        RecoveryResource(database_url=url, heartbeat_timeout=60.0, migration_packages=[])
    assert checks == [60.0]
    again = RecoveryResource(database_url=url, heartbeat_timeout=60.0, migration_packages=[])
    assert again.heartbeat_settings().timeout == 60.0 and again.pipeline_limits().heartbeat_timeout == 60.0
    assert checks == [60.0]
    RecoveryResource(database_url=url, heartbeat_timeout=61.0, migration_packages=[])
    assert checks == [60.0, 61.0]


@pytest.mark.parametrize("bad", [{"heartbeat_timeout": float("nan")}, {"retry_jitter": 2.0},
                                 {"heartbeat_interval": 80.0, "heartbeat_timeout": 90.0}])
def test_a_bad_configuration_is_refused_at_every_build(checks, bad):
    for attempt in range(2):
        with pytest.raises(pydantic.ValidationError):
            RecoveryResource(database_url="sqlite:///unused.db", **bad)
        assert len(checks) == attempt + 1
    assert resources._checked_configs == {}


@pytest.mark.parametrize("build", [
    lambda: RecoveryResource(database_url="postgresql://u:hunter2@db/x", same_eror_limit=3),
    lambda: __import__("recovery_ext").LLMResource(api_key="sk-hunter2", tokens_per_minuet=1000),
], ids=["RecoveryResource", "LLMResource"])
def test_a_misspelled_setting_is_refused_by_name_not_silently_left_at_its_default(build):
    """Before: pydantic's default for Dagster resources ignores an unknown keyword, so `same_eror_limit=3` built a
    resource with the default of 5 and nothing said so. Now it is refused when the definitions load, naming the
    field, without the values given (a URL's password, an API key)."""
    with pytest.raises(pydantic.ValidationError) as info:
        build()
    shown = str(info.value)
    assert ("same_eror_limit" in shown or "tokens_per_minuet" in shown) and "Extra inputs are not permitted" in shown
    assert "hunter2" not in shown
