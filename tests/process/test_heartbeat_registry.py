"""The heartbeat registry's thread, watched in real time: while a lease is held, every pulse moves the pipeline's
heartbeat deadline to the database's clock plus its timeout; once the lease is released the thread ends, no pulse
follows, and the pipeline expires at its last deadline. The registry's bookkeeping is tested in
tests/store/test_run_store.py.

It asserts the mechanism, not a schedule: on a busy machine a process can go unscheduled for longer than a short
timeout (measured beside sixteen CPU hogs on two cores: a plain ``time.sleep(0.05)`` thread of the same process
overslept by 1.4 s while the database answered another connection in 0.03 s), and a pipeline whose process is not
running is rightly found an orphan. The timeout that survives that is the user's setting, not this test's."""

from __future__ import annotations

import datetime as dt

from recovery_ext._liveness.heartbeat import HeartbeatRegistry, HeartbeatSettings
from recovery_pipelines.devserver import wait_for

TIMEOUT = 1.0


def make(store):
    return store.pipelines.create_pipeline("job", ["a", "b", "c"], owner="run-1", origin_run_id="run-1", params={})


def beat(store, pipeline_id):
    pipeline = store.pipelines.get_pipeline(pipeline_id)
    return pipeline.heartbeat_at, pipeline.heartbeat_deadline


def test_the_registry_thread_keeps_a_pipeline_alive_and_stops_when_released(store):
    own = make(store)
    registry = HeartbeatRegistry(store)
    seen = [beat(store, own.pipeline_id)]  # the beat its creation gave it
    lease = registry.register(own, HeartbeatSettings(interval=0.1, timeout=TIMEOUT))
    try:
        def five_pulses_seen() -> bool:
            now = beat(store, own.pipeline_id)
            if now[0] != seen[-1][0]:
                seen.append(now)
            return len(seen) > 5

        wait_for(five_pulses_seen, timeout=60, interval=0.05, what="five pulses of the registry thread")
    finally:
        lease.release()
    pulsed = seen[1:]
    assert [at for at, _ in seen] == sorted({at for at, _ in seen})  # each pulse a later beat
    # each pulse gives the pipeline its full timeout from the database's clock at that pulse
    assert [deadline - at for at, deadline in pulsed] == [dt.timedelta(seconds=TIMEOUT)] * len(pulsed)

    wait_for(lambda: registry._thread is None, timeout=30, interval=0.05, what="the heartbeat thread to end")
    pulses, last = registry.pulses, beat(store, own.pipeline_id)
    [orphan] = wait_for(lambda: store.recovery.find_orphans(), timeout=30, interval=0.1,
                        what="the released pipeline to expire")
    assert orphan.id == own.pipeline_id and orphan.heartbeat_deadline == last[1]  # expired at its last deadline
    assert registry.pulses == pulses and beat(store, own.pipeline_id) == last  # the lease really stopped pulsing
