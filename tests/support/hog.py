"""A CPU hog: one busy process per core, so liveness and e2e tests run on a loaded machine.

A test that passes only on an idle machine is not done: step start-up, heartbeat threads and
sensor ticks all slow down under load, and the hog makes that the normal case in the suite.

``RX_HOGS_PER_CORE`` (default 1) raises the load for an overload run of the suite, e.g.
``RX_HOGS_PER_CORE=8 make test``: a production machine with a noisy neighbour is slower than one hog per core.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

HOGS_PER_CORE_ENV = "RX_HOGS_PER_CORE"
BUSY_LOOP = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True:\n    pass\n"


def hogs_per_core() -> int:
    """``$RX_HOGS_PER_CORE`` as a whole number from 1 to 64 (default 1); anything else stops the suite at once."""
    raw = os.environ.get(HOGS_PER_CORE_ENV, "1").strip()
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= 64:
        raise ValueError(f"{HOGS_PER_CORE_ENV} must be a whole number from 1 to 64, not {raw!r}")
    return int(raw)


@contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[list[subprocess.Popen]]:
    """Run ``processes`` (default: ``RX_HOGS_PER_CORE`` per core) busy loops at normal priority until the block exits.

    Under pytest-xdist the default is shared out between the workers (at least one each), so tests running side by
    side load the machine as one test did alone, not once per worker.

    On exit it checks that every hog was still running, so a hog that died early fails the test
    instead of silently turning it into an idle-machine test.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    count = processes or max(1, (os.cpu_count() or 2) * hogs_per_core() // max(1, workers))
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        yield procs
        died = [p.pid for p in procs if p.poll() is not None]
        assert not died, f"CPU hog processes {died} stopped before the test ended"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
