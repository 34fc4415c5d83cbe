"""The recovery scan: stats and events, corrupt rows, outages, settings."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from recovery_ext._errors import ConfigurationError
from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._settings import parse_duration
from recovery_ext import scan
from recovery_ext._recovery.protocol import RecoverySettings, default_outage_policy, summary_line
from recovery_ext._store.models import PassPlan, PassResult, PipelineLimits, Scope
from recovery_ext._store.schema import nodes, pipelines
from recovery_ext._store.store import RecoveryStore

from helpers import expire


def orphan(store, owner, **kw):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner=owner, origin_run_id=owner, **kw)
    store.pipelines.start_node(own, "a")
    expire(store, own.pipeline_id)
    return own


def test_scan_reclaims_gives_up_and_reports_with_events(store):
    a = orphan(store, "a")
    b = orphan(store, "b", limits=PipelineLimits(max_resumes=0))
    live = store.pipelines.create_pipeline("job", ["a"], owner="live", origin_run_id="live")
    stats = scan(store, PassPlan(trigger="startup"))
    assert (stats.found, stats.reclaimed, stats.given_up, stats.failed, stats.error) == (2, 1, 1, 0, None)
    assert stats.reclaimed_pipelines[0].pipeline_id == a.pipeline_id
    assert stats.given_up_pipelines[0].pipeline_id == b.pipeline_id
    assert stats.duration_ms > 0
    assert store.pipelines.get_pipeline(live.pipeline_id).epoch == 1
    kinds = [e["kind"] for e in store.reports.recent_events()]
    assert kinds[-1] == "recovery_completed" and "recovery_started" not in kinds
    assert "pipeline_recovered" in kinds and "pipeline_stuck" in kinds
    assert summary_line(stats) == "2 orphans: 1 resumed, 1 given up"


def test_corrupt_rows_fail_with_a_reason_and_do_not_stop_the_scan(store):
    good = orphan(store, "good")
    bad_node = orphan(store, "bad-node")
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == bad_node.pipeline_id, nodes.c.name == "b")
                     .values(status="exploded"))
    weird = store.pipelines.create_pipeline("job", ["a"], owner="weird", origin_run_id="weird")
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == weird.pipeline_id).values(status="paused"))
    if store.dialect.name == "sqlite":
        bad_json = orphan(store, "bad-json")
        with store.write() as conn:
            conn.exec_driver_sql(f"UPDATE rx_pipelines SET params = '{{not json' WHERE id = {bad_json.pipeline_id}")
    stats = scan(store)
    assert [r.pipeline_id for r in stats.reclaimed_pipelines] == [good.pipeline_id]
    reasons = {g.pipeline_id: g.reason for g in stats.given_up_pipelines}
    assert "unknown status 'exploded'" in reasons[bad_node.pipeline_id]
    assert "unknown pipeline status 'paused'" in reasons[weird.pipeline_id]
    if store.dialect.name == "sqlite":
        assert "not valid JSON" in reasons[bad_json.pipeline_id]
    for pid in reasons:
        assert store.pipelines.get_pipeline(pid).status == "failed"
    assert stats.corrupt == len(reasons) and stats.error is None


def test_database_outage_is_retried_with_backoff_then_reported_not_raised(pg_admin):
    # the store's own retries are off (retry_budget=0), so each of the scan's attempts fails at once:
    # this is the scan's policy under test, not the store's (tests/e2e/test_pg_outage.py has that)
    store = RecoveryStore("postgresql://postgres@127.0.0.1:1/nothing_listens_here", retry_budget=0)
    slept: list[float] = []
    stats = scan(store, policy=default_outage_policy(sleep=slept.append))
    assert stats.failed == 1 and "unavailable" in stats.error
    assert len(slept) == 2 and slept[1] > slept[0]  # three attempts, exponential waits


def test_database_going_away_mid_scan_is_reported(store, monkeypatch):
    orphan(store, "x")
    calls = {"n": 0}
    real = store.recovery.recovery_pass

    def flaky(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            from recovery_ext._errors import StoreUnavailable

            raise StoreUnavailable("database unavailable: server closed the connection unexpectedly")
        return real(*args, **kw)

    monkeypatch.setattr(store.recovery, "recovery_pass", flaky)
    stats = scan(store, policy=default_outage_policy(sleep=lambda s: None))
    assert calls["n"] == 2 and stats.reclaimed == 1 and stats.error is None


def test_the_scan_takes_what_its_plan_leaves_open_from_its_settings_and_keeps_the_rest():
    seen = []

    class Recorder:
        @property
        def recovery(self):  # the scan reaches the pass through the store's recovery component
            return self

        def recovery_pass(self, plan, scope):
            seen.append((plan, scope))
            return PassResult()

    settings = RecoverySettings(max_per_scan=5, launch_grace_seconds=60, max_age_seconds=7200)
    scan(Recorder(), settings=settings)
    scan(Recorder(), PassPlan(dead_owner_runs=["r1"], grace_seconds=10, limit=2, launching=True),
         Scope(["job"], "prod", "sensor-a"), settings=settings)
    (filled, anywhere), (kept, scope) = seen
    assert (filled.grace_seconds, filled.max_age_seconds, filled.limit, filled.launching, filled.trigger) == \
        (60, 7200, 5, False, "on_demand")
    assert anywhere == Scope()
    assert (kept.dead_owner_runs, kept.grace_seconds, kept.max_age_seconds, kept.limit) == (("r1",), 10, 7200, 2)
    assert scope == Scope(("job",), "prod", "sensor-a")


@pytest.mark.parametrize("build", [lambda: Scope(job_names="job"), lambda: PassPlan(dead_owner_runs="run-1")])
def test_a_lone_string_is_refused_where_a_plan_or_scope_takes_a_sequence(build):
    """As a sequence, ``"job"`` would be the jobs ``j``, ``o`` and ``b``: a scope that matches nothing."""
    with pytest.raises(ConfigurationError, match="must be a sequence, not the single string"):
        build()


def test_disabled_recovery_does_nothing():
    stats = scan(object(), settings=RecoverySettings(enabled=False))
    assert stats.reclaimed == 0 and "disabled" in stats.error


@pytest.mark.parametrize("kwargs", [dict(interval=0), dict(interval=-1), dict(timeout=0),
                                    dict(interval=50, timeout=90), dict(interval="x"), dict(stall_timeout=-5)])
def test_invalid_heartbeat_settings_are_rejected_clearly(kwargs):
    with pytest.raises(ConfigurationError) as info:
        HeartbeatSettings(**kwargs)
    assert "heartbeat" in str(info.value) or "stall_timeout" in str(info.value)


def test_heartbeat_defaults_follow_seed_000():
    s = HeartbeatSettings()
    assert (s.interval, s.timeout) == (30, 90)


def test_settings_from_env_validate(monkeypatch):
    monkeypatch.setenv("RECOVERY_HEARTBEAT_INTERVAL", "soon")
    with pytest.raises(ConfigurationError, match="RECOVERY_HEARTBEAT_INTERVAL"):
        HeartbeatSettings.from_env()
    monkeypatch.setenv("RECOVERY_ENABLE_ORPHAN_RECOVERY", "maybe")
    with pytest.raises(ConfigurationError, match="true or false"):
        RecoverySettings.from_env()
    monkeypatch.setenv("RECOVERY_ENABLE_ORPHAN_RECOVERY", "false")
    monkeypatch.setenv("RECOVERY_LAUNCH_GRACE", "2m")
    s = RecoverySettings.from_env()
    assert (s.enabled, s.launch_grace_seconds) == (False, 120)


def test_parse_duration():
    assert parse_duration("10m") == 600 and parse_duration("90") == 90 and parse_duration("1h") == 3600
    for bad in ("", "ten", "-5s", "0"):
        with pytest.raises(ValueError):
            parse_duration(bad)
