"""The recovery scan: find orphans, give up on hopeless ones, reclaim the rest, report.

It knows nothing of Dagster: the sensor passes in the runs Dagster already knows are
dead, and decides what to launch. A database outage is retried with backoff and then
reported in the stats; the scan never raises into its caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .env import check_count, check_seconds, env_bool, env_seconds
from .models import ScanStats
from .redaction import redact
from .retry import RetryPolicy

log = logging.getLogger("recovery_ext.recovery")


@dataclass(frozen=True)
class RecoverySettings:
    """Seed 000's configuration table, plus seed 001's age limit. ``max_per_scan=None``: no cap."""

    enabled: bool = True
    max_per_scan: int | None = 1000
    launch_grace_seconds: float = 300.0
    max_age_seconds: float | None = 24 * 3600.0

    def __post_init__(self) -> None:
        if self.max_per_scan is not None:  # None: no cap
            check_count("max_per_scan", self.max_per_scan, minimum=1)
        check_seconds("launch_grace_seconds", self.launch_grace_seconds, minimum=1.0)
        check_seconds("max_age_seconds", self.max_age_seconds, minimum=1.0, maximum=366 * 86400.0, allow_none=True)

    @classmethod
    def from_env(cls) -> "RecoverySettings":
        return cls(
            enabled=env_bool("RECOVERY_ENABLE_ORPHAN_RECOVERY", True),
            launch_grace_seconds=env_seconds("RECOVERY_LAUNCH_GRACE", 300.0),
            max_age_seconds=env_seconds("RECOVERY_MAX_AGE", 24 * 3600.0, maximum=366 * 86400.0),
        )


def default_outage_policy(sleep: Callable[[float], None] | None = None) -> RetryPolicy:
    """Seed 001: retry a database outage with exponential backoff, 3 attempts."""
    return RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=5.0, same_error_limit=3, sleep=sleep)


def scan(
    store,
    *,
    settings: RecoverySettings | None = None,
    dead_owner_runs: Sequence[str] = (),
    launching: bool = False,
    limit: int | None = None,
    trigger: str = "on_demand",
    policy: RetryPolicy | None = None,
    job_names: Sequence[str] | None = None,
    launcher: str | None = None,
    retrying_owner_runs: Sequence[str] = (),
) -> ScanStats:
    """One recovery pass. ``launching=True`` reserves reclaimed pipelines for ``launcher`` at once.

    ``limit`` caps the reclaims of this pass; ``None`` uses ``settings.max_per_scan``.
    """
    settings = settings or RecoverySettings()
    policy = policy or default_outage_policy()
    stats = ScanStats()
    started = time.perf_counter()
    if not settings.enabled:
        stats.error = "orphan recovery is disabled (RECOVERY_ENABLE_ORPHAN_RECOVERY=false)"
        return stats
    try:
        corrupt = policy.call(store.fail_unknown_statuses)
        given_up = policy.call(store.give_up_hopeless, dead_owner_runs=dead_owner_runs,
                               max_age_seconds=settings.max_age_seconds, job_names=job_names,
                               retrying_owner_runs=retrying_owner_runs)
        reclaimed, corrupt_rows = policy.call(
            store.reclaim, limit=limit if limit is not None else settings.max_per_scan,
            dead_owner_runs=dead_owner_runs, launching=launching, grace_seconds=settings.launch_grace_seconds,
            max_age_seconds=settings.max_age_seconds, reason=trigger, job_names=job_names, launcher=launcher,
            retrying_owner_runs=retrying_owner_runs,
        )
        stats.given_up_pipelines = [*corrupt, *given_up, *corrupt_rows]
        stats.reclaimed_pipelines = reclaimed
        stats.corrupt = len(corrupt) + len(corrupt_rows)
        stats.given_up = len(given_up) + stats.corrupt
        stats.reclaimed = len(reclaimed)
        stats.found = stats.reclaimed + stats.given_up
    except Exception as exc:  # noqa: BLE001 - the scan reports; it never crashes its caller
        stats.failed += 1
        stats.error = redact(f"{type(exc).__name__}: {exc}")
        log.error("recovery scan failed: %s", stats.error)
    stats.duration_ms = (time.perf_counter() - started) * 1000
    if stats.error is None and stats.found:  # an idle tick records nothing: its tick message is enough
        try:
            policy.call(store.record_event, "recovery_completed", {"trigger": trigger, **stats.as_dict()})
        except Exception as exc:  # noqa: BLE001
            stats.error = redact(f"could not record recovery_completed: {exc}")
    log.info("recovery scan (%s): %s", trigger, summary_line(stats))
    return stats


def summary_line(stats: ScanStats, launched: int | None = None) -> str:
    resumed = stats.reclaimed if launched is None else launched
    parts = [f"{stats.found} orphan{'s' if stats.found != 1 else ''}: {resumed} resumed, {stats.given_up} given up"]
    if stats.corrupt:
        parts.append(f"{stats.corrupt} corrupt")
    if stats.error:
        parts.append(f"error: {stats.error}")
    return "; ".join(parts)

