"""When an orphan sensor prunes finished pipelines: a pass at most once an hour, a few seconds of batches a tick.

The first pass after retention is switched on may find a year of history. A tick must stay short (Dagster
times a sensor evaluation out), so a pass spends at most :data:`TICK_BUDGET_SECONDS` per tick and, while
prunable pipelines are left, goes on at the next tick instead of waiting an hour. Once a pass finds none
left, the next one starts an hour later: an idle tick makes no query for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from recovery_ext._classify.redaction import redact
from recovery_ext._store.interfaces import SensorStore

log = logging.getLogger("recovery_ext.retention")

PIPELINE_RETENTION_EVERY = 3600.0  # seconds between two prune passes of one sensor process
TICK_BUDGET_SECONDS = 5.0  # of batches per tick while a pass has prunable pipelines left


class RetentionSchedule:
    """One sensor process's prune passes: when the last began, and whether it is still under way."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, batch_size: int | None = None) -> None:
        self._clock = clock
        self.batch_size = batch_size
        self._started_at: float | None = None
        self._under_way = False

    def run(self, store: SensorStore, older_than_seconds: float | None, *, deployment: str | None) -> int:
        """Prune if a pass is due or under way; returns the pipelines deleted. Never raises (housekeeping: a
        failed batch is tried again at the next pass, an hour later)."""
        if older_than_seconds is None:
            return 0
        now = self._clock()
        if not self._under_way:
            if self._started_at is not None and now - self._started_at < PIPELINE_RETENTION_EVERY:
                return 0
            self._started_at = now
        try:
            result = store.reports.prune_finished_pipelines(older_than_seconds, deployment=deployment,
                                                    batch_size=self.batch_size, time_budget=TICK_BUDGET_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the tick goes on; every batch that committed stays done
            self._under_way = False
            log.warning("could not prune finished pipelines: %s", redact(exc))
            return 0
        self._under_way = not result.done
        if result.pipelines:
            log.info("pruned %d finished pipeline(s) older than %g s%s", result.pipelines, older_than_seconds,
                     " (more left: going on next tick)" if self._under_way else "")
        return result.pipelines
