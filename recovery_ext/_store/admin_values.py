"""The operator's values: a migration, a prune's result and where a followed event log is (what ``recovery-ext
migrate``, ``prune`` and ``events --follow`` get back). Plain values, imported through models.py (their one door:
``from recovery_ext._store.models import PruneResult``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Ids below the highest one seen that are still tracked as possibly in flight.
GAP_WINDOW = 10_000


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    def statements(self) -> list[str]:
        """Split on semicolons that end a line, except inside a dollar-quoted function body or a SQLite
        trigger's body (from a line ending in BEGIN to a line that is END;)."""
        parts: list[str] = []
        current: list[str] = []
        quoted = trigger = False
        for line in self.sql.splitlines():
            if not quoted and line.strip().startswith("--"):
                continue
            current.append(line)
            quoted ^= line.count("$$") % 2 == 1
            if not quoted:
                trigger = (trigger or line.rstrip().upper().endswith(" BEGIN") or line.strip().upper() == "BEGIN") \
                    and line.strip().upper() != "END;"
            if not quoted and not trigger and line.rstrip().endswith(";"):
                parts.append("\n".join(current).strip().removesuffix(";").strip())
                current = []
        parts.append("\n".join(current).strip().removesuffix(";").strip())
        return [part for part in parts if part]


@dataclass
class EventCursor:
    """Where ``follow_events`` is: the highest id shown, and the lower ids not seen yet (gaps)."""

    last_id: int = 0
    gaps: dict[int, int | None] = field(default_factory=dict)  # id -> xmax to wait for (None: note it next poll)

    def advance(self, ids: Sequence[int], *, xmin: int | None, xmax: int | None) -> set[int]:
        """Record the ``ids`` found by one poll; returns those not shown before."""
        new = {i for i in ids if i > self.last_id or i in self.gaps}
        for i in new:
            self.gaps.pop(i, None)
        for gap, wait_for in list(self.gaps.items()):
            if xmin is None:  # one writer at a time, commits in id order: a gap is a rollback
                del self.gaps[gap]
            elif wait_for is None:
                self.gaps[gap] = xmax
            elif xmin >= wait_for:
                del self.gaps[gap]
        top = max(ids, default=self.last_id)
        if xmin is not None:  # new gaps wait one poll before their xmax is noted (see follow_events)
            for missing in range(max(self.last_id + 1, top - GAP_WINDOW), top):
                if missing not in new:
                    self.gaps.setdefault(missing, None)
        self.last_id = max(self.last_id, top)
        return new


@dataclass
class PruneResult:
    """What a prune deleted (or, dry, would delete): pipelines, rows per table, batches; ``done`` when no
    prunable pipeline was left (else a time budget or a batch limit ended it)."""

    pipelines: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    compacted: dict[str, int] = field(default_factory=dict)  # rows kept as a compact record (dedupe keys), per table
    batches: int = 0
    done: bool = False
    dry_run: bool = False
    by_status: dict[str, int] = field(default_factory=dict)
    last_batch_seconds: float = 0.0  # how long the last batch's transaction took (what a writer may wait on SQLite)
    longest_batch_seconds: float = 0.0
    # of ``pipelines``, those that finished with no end time (``completed_at``, rows older versions wrote), aged by
    # their last update instead: shown apart, since their age is a stand-in
    no_end_time: int = 0

    def add(self, counts: dict[str, int], seconds: float, compacted: dict[str, int]) -> None:
        """One batch's rows per table and its time (the pipelines it deleted the caller counts from ``rows``)."""
        self.batches += 1
        self.last_batch_seconds = seconds
        self.longest_batch_seconds = max(self.longest_batch_seconds, seconds)
        for table, n in counts.items():
            self.rows[table] = self.rows.get(table, 0) + n
        for table, n in compacted.items():
            if n:
                self.compacted[table] = self.compacted.get(table, 0) + n

    def as_dict(self) -> dict[str, object]:
        return {"pipelines": self.pipelines, "rows": dict(sorted(self.rows.items())),
                "compacted": dict(sorted(self.compacted.items())), "batches": self.batches,
                "done": self.done, "dry_run": self.dry_run, "by_status": dict(sorted(self.by_status.items())),
                "longest_batch_seconds": round(self.longest_batch_seconds, 4), "no_end_time": self.no_end_time}
