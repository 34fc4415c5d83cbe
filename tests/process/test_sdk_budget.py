"""The shared budget governs the parallelism (SQLite and PostgreSQL): 4 processes of 32 asyncio tasks each send
through LLMResource's async client to a stand-in that enforces a tokens-per-window quota; what the stand-in
answered in any window never exceeds it, and nothing was refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sdk_stand_in import SdkStandIn

SUPPORT = Path(__file__).parents[1] / "support"
TOKENS, WINDOW, PROCESSES, TASKS = 1500, 2.0, 4, 32


def test_four_processes_of_32_tasks_never_send_past_the_shared_budget(db_url, store):
    server = SdkStandIn(tokens=TOKENS, window=WINDOW)
    url = server.start()
    try:
        env = {**os.environ, "RECOVERY_DATABASE_URL": db_url, "BUDGET_LLM_URL": url, "BUDGET_TOKENS": str(TOKENS),
               "BUDGET_WINDOW": str(WINDOW), "BUDGET_TASKS": str(TASKS),
               "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
        workers = [subprocess.Popen([sys.executable, str(SUPPORT / "sdk_budget_run.py")],
                                    env={**env, "BUDGET_TAG": f"p{n}"}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT) for n in range(PROCESSES)]
        outputs = [w.communicate(timeout=240)[0].decode(errors="replace") for w in workers]
        assert [w.returncode for w in workers] == [0] * PROCESSES, outputs[0][-3000:]
    finally:
        server.stop()
    assert len(server.answered()) == PROCESSES * TASKS
    assert 429 not in server.statuses()
    assert server.max_tokens_in_window() <= TOKENS
