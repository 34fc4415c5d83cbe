"""The recovery pass's settings, its outage policy and its one-line summary.

The pass itself is :class:`~recovery_ext._recovery.protocol.RecoveryProtocol`; the scan
(:func:`~recovery_ext._recovery.protocol.scan`) is that pass with an orchestrator that launches nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from recovery_ext._settings import check_count, check_seconds, env_bool, env_seconds
from recovery_ext._store.models import DEFAULT_LAUNCH_GRACE, PassPlan, ScanStats
from recovery_ext._classify.retry import RetryPolicy

log = logging.getLogger("recovery_ext._recovery.scan")


@dataclass(frozen=True)
class RecoverySettings:
    """The orphan threshold, the on/off switch and the age limit. ``max_per_scan=None``: no cap."""

    enabled: bool = True
    max_per_scan: int | None = 1000
    launch_grace_seconds: float = DEFAULT_LAUNCH_GRACE
    max_age_seconds: float | None = 24 * 3600.0

    def __post_init__(self) -> None:
        if self.max_per_scan is not None:  # None: no cap
            check_count("max_per_scan", self.max_per_scan, minimum=1)
        check_seconds("launch_grace_seconds", self.launch_grace_seconds, minimum=1.0)
        check_seconds("max_age_seconds", self.max_age_seconds, minimum=1.0, maximum=366 * 86400.0, allow_none=True)

    def fill(self, plan: PassPlan) -> PassPlan:
        """``plan`` with the launch grace, maximum age and cap it leaves ``None`` taken from these settings."""
        return replace(plan,
                       grace_seconds=self.launch_grace_seconds if plan.grace_seconds is None else plan.grace_seconds,
                       max_age_seconds=self.max_age_seconds if plan.max_age_seconds is None else plan.max_age_seconds,
                       limit=self.max_per_scan if plan.limit is None else plan.limit)

    @classmethod
    def from_env(cls) -> RecoverySettings:
        return cls(
            enabled=env_bool("RECOVERY_ENABLE_ORPHAN_RECOVERY", True),
            launch_grace_seconds=env_seconds("RECOVERY_LAUNCH_GRACE", DEFAULT_LAUNCH_GRACE),
            max_age_seconds=env_seconds("RECOVERY_MAX_AGE", 24 * 3600.0, maximum=366 * 86400.0),
        )


def default_outage_policy(sleep: Callable[[float], None] | None = None) -> RetryPolicy:
    """A database outage during a scan is retried with exponential backoff, 3 attempts."""
    return RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=5.0, same_error_limit=3, sleep=sleep)


def summary_line(stats: ScanStats, launched: int | None = None) -> str:
    resumed = stats.reclaimed if launched is None else launched
    parts = [f"{stats.found} orphan{'s' if stats.found != 1 else ''}: {resumed} resumed, {stats.given_up} given up"]
    if stats.corrupt:
        parts.append(f"{stats.corrupt} corrupt")
    if stats.error:
        parts.append(f"error: {stats.error}")
    return "; ".join(parts)

