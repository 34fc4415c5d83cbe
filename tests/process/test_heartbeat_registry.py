"""The heartbeat registry's thread, watched in real time: it keeps a pipeline alive over three times its timeout, and
once its lease is released the pipeline expires no sooner than that timeout. Seconds of waiting per database, so
it runs in tests/process; the registry's bookkeeping is tested in tests/store/test_run_store.py."""

from __future__ import annotations

import time

from recovery_ext._liveness.heartbeat import HeartbeatRegistry, HeartbeatSettings
from recovery_pipelines.devserver import wait_for


def make(store):
    return store.pipelines.create_pipeline("job", ["a", "b", "c"], owner="run-1", origin_run_id="run-1", params={})


def test_the_registry_thread_keeps_a_pipeline_alive_and_stops_when_released(store):
    own = make(store)
    registry = HeartbeatRegistry(store)
    lease = registry.register(own, HeartbeatSettings(interval=0.1, timeout=1.0))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert store.recovery.find_orphans() == []
        time.sleep(0.1)
    assert registry.pulses >= 5
    lease.release()
    released = time.monotonic()
    wait_for(lambda: store.recovery.find_orphans(), timeout=10, interval=0.1, what="the released pipeline to expire")
    assert time.monotonic() - released >= 0.9  # not before its 1 s timeout: the lease really stopped pulsing
    assert [o.id for o in store.recovery.find_orphans()] == [own.pipeline_id]
