"""Which pipelines the roll-ups of finished work hold (migration 0017), and so which are read live.

Its own module because both the ledger's reads and the roll-ups' readers (``aggregates.py``) need it, and the
roll-ups' readers use the ledger's figures.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, literal_column, select

from recovery_ext._store.schema import pipelines
from recovery_ext._store.statuses import PipelineStatus

# What the roll-ups call finished: a pipeline in one of these is in them, any other is read live.
ROLLED_UP = (PipelineStatus.COMPLETED, PipelineStatus.FAILED)


def live_pipeline_ids() -> Select[Any]:
    """The ids of pipelines not rolled up yet: exactly those in the partial index rx_pipelines_live, whose
    predicate the planner matches only against these literals (bound parameters make it scan the table)."""
    live = pipelines.alias("live")
    return select(live.c.id).where(live.c.status.not_in([literal_column(f"'{s}'") for s in ROLLED_UP]))
