"""The application tables as SQLAlchemy Core objects.

The migrations in ``sql/<dialect>/`` create these tables; ``tests/store/test_migrations.py``
proves the two agree. Two column types hide the dialect differences (``_store/dialects.py``):
:class:`DbTime` (``timestamptz`` on PostgreSQL, epoch seconds on SQLite) and :class:`DbJson`
(``jsonb`` on PostgreSQL, text on SQLite).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    and_,
    column,
    or_,
    table,
)

from recovery_ext._store.dialects import DbJson, DbTime
from recovery_ext._store.statuses import BreakerState, ItemStatus, NodeStatus, PipelineStatus, QueueStatus

# Every value a status column may hold (the scan reports any other as corrupt).
PIPELINE_STATUSES = tuple(PipelineStatus)
NODE_STATUSES = tuple(NodeStatus)
ITEM_STATUSES = tuple(ItemStatus)
BREAKER_STATES = tuple(BreakerState)
QUEUE_STATUSES = tuple(QueueStatus)


metadata = MetaData()

migrations_table = Table(
    "rx_schema_migrations",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("applied_at", DbTime, nullable=False),
)

# Migrations of an application's own tables (``RecoveryStore.migrate(package=...)``), apart from the library's.
app_migrations_table = Table(
    "rx_app_migrations",
    metadata,
    Column("package", Text, primary_key=True),
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("applied_at", DbTime, nullable=False),
)

pipelines = Table(
    "rx_pipelines",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("job_name", Text, nullable=False),
    Column("origin_run_id", Text, unique=True),
    Column("params", DbJson, nullable=False),
    Column("status", Text, nullable=False),
    Column("current_node", Text),
    Column("owner", Text),
    Column("resumed_from", Text),
    Column("epoch", Integer, nullable=False),
    Column("heartbeat_at", DbTime),
    Column("heartbeat_deadline", DbTime),
    Column("deadline", DbTime),
    Column("resume_count", Integer, nullable=False),
    Column("max_resumes", Integer, nullable=False),
    Column("created_at", DbTime, nullable=False),
    Column("started_at", DbTime),
    Column("updated_at", DbTime, nullable=False),
    Column("completed_at", DbTime),
    Column("error", Text),
    Column("gave_up_reason", Text),
    Column("waiting_until", DbTime),
    Column("waiting_since", DbTime),
    Column("waiting_reason", Text),
    Column("launcher", Text),
    Column("deployment", Text, nullable=False, server_default="default"),
)


def waiting_shown(now: Any) -> Any:
    """A pipeline shown as ``waiting``: running, paused with a next try, and live. Once its heartbeat expired
    (its run ended or died mid-pause) it is an orphan awaiting its resume, not a next try nobody will make. The
    one definition ``status``, the metrics, the sensor tick and every pipeline read use; ``now``: the database
    clock (``dialect.now()``)."""
    p = pipelines.c
    return and_(p.status == PipelineStatus.RUNNING, p.waiting_until.isnot(None),
                or_(p.heartbeat_deadline.is_(None), p.heartbeat_deadline >= now))


nodes = Table(
    "rx_nodes",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("pipeline_id", BigInteger, ForeignKey("rx_pipelines.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("position", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("optional", Boolean, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("items_total", Integer),
    Column("error", Text),
    Column("error_category", Text),
    Column("error_status_code", Integer),
    Column("run_id", Text),
    Column("started_at", DbTime),
    Column("completed_at", DbTime),
    Column("updated_at", DbTime, nullable=False),
    Column("heartbeat_at", DbTime),
    Column("heartbeat_deadline", DbTime),
    Column("stall_deadline", DbTime),
    Column("output", DbJson),
    Column("process", Text),
    Column("watcher", Text),
    Column("vouched_until", DbTime),
    Column("died_at", DbTime),
    UniqueConstraint("pipeline_id", "name", name="rx_nodes_pipeline_name"),
)

node_items = Table(
    "rx_node_items",
    metadata,
    # A foreign key on SQLite; on PostgreSQL the checkpoint's fence holds the pipeline row instead, and a trigger
    # deletes the items with their pipeline (migration 0025)
    Column("pipeline_id", BigInteger, ForeignKey("rx_pipelines.id", ondelete="CASCADE"), primary_key=True),
    Column("node_name", Text, primary_key=True),
    Column("item_key", Text, primary_key=True),
    Column("status", Text, nullable=False),
    Column("result", DbJson),
    Column("run_id", Text),
    Column("epoch", Integer),
    Column("completed_at", DbTime, nullable=False),
)

queue_items = Table(
    "rx_queue_items",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("dedupe_key", Text),
    Column("payload", DbJson, nullable=False),
    Column("status", Text, nullable=False),
    Column("worker", Text),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("created_at", DbTime, nullable=False),
    Column("updated_at", DbTime, nullable=False),
    Column("started_at", DbTime),
    Column("heartbeat_deadline", DbTime),
    Column("completed_at", DbTime),
    Column("result", DbJson),
    Column("last_error", Text),
    Column("last_error_at", DbTime),
    Column("available_at", DbTime),
    Column("holder_pipeline_id", BigInteger),
    Column("holder_epoch", Integer),
    UniqueConstraint("queue", "dedupe_key", name="rx_queue_items_dedupe"),
)

transitions = Table(
    "rx_transitions",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("entity_type", Text, nullable=False),
    Column("entity_id", BigInteger, nullable=False),
    Column("pipeline_id", BigInteger),
    Column("from_status", Text),
    Column("to_status", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("data", DbJson),
    Column("at", DbTime, nullable=False),
)

events = Table(
    "rx_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("kind", Text, nullable=False),
    Column("pipeline_id", BigInteger),
    Column("queue_item_id", BigInteger),
    Column("payload", DbJson),
    Column("created_at", DbTime, nullable=False),
)

circuit_breakers = Table(
    "rx_circuit_breakers",
    metadata,
    Column("endpoint", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("consecutive_failures", Integer, nullable=False),
    Column("open_count", Integer, nullable=False),
    Column("opened_at", DbTime),
    Column("open_until", DbTime),
    Column("probe_owner", Text),
    Column("probe_deadline", DbTime),
    Column("last_error", Text),
    Column("updated_at", DbTime, nullable=False),
)

# The ledger of provider work: one row per provider call, its id made by the caller (see ledger.py).
provider_calls = Table(
    "rx_provider_calls",
    metadata,
    Column("id", Text, primary_key=True),
    Column("pipeline_id", BigInteger, ForeignKey("rx_pipelines.id", ondelete="CASCADE")),
    Column("node_name", Text),
    Column("item_key", Text),
    Column("run_id", Text),
    Column("epoch", Integer),
    Column("endpoint", Text, nullable=False),
    Column("model", Text),
    Column("tokens_in", BigInteger, nullable=False),
    Column("tokens_out", BigInteger, nullable=False),
    Column("latency_seconds", Float, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("cost", Float),
    Column("reached_checkpoint", Boolean, nullable=False),
    Column("recorded_at", DbTime, nullable=False),
    Column("replays", Integer, nullable=False, server_default="0"),
    Column("note", Text),
)

# The call journal: the answer of each journaled provider call, by where it was asked and what was asked
# (see journal.py); pruned by a trigger when its pipeline completes or is canceled.
call_journal = Table(
    "rx_call_journal",
    metadata,
    Column("pipeline_id", BigInteger, ForeignKey("rx_pipelines.id", ondelete="CASCADE"), primary_key=True),
    Column("node_name", Text, primary_key=True),
    Column("item_key", Text, primary_key=True),
    Column("call_key", Text, primary_key=True),
    Column("call_id", Text, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("answer", Text, nullable=False),
    Column("answered_at", DbTime, nullable=False),
)

# Asynchronous provider jobs (see jobs.py): each submission, its token written before it, its job id once known.
provider_jobs = Table(
    "rx_provider_jobs",
    metadata,
    Column("pipeline_id", BigInteger, ForeignKey("rx_pipelines.id", ondelete="CASCADE"), primary_key=True),
    Column("node_name", Text, primary_key=True),
    Column("token", Text, primary_key=True),
    Column("provider", Text, nullable=False),
    Column("job_id", Text),
    Column("status", Text, nullable=False),
    Column("items", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("call_id", Text, nullable=False),
    Column("created_at", DbTime, nullable=False),
    Column("updated_at", DbTime, nullable=False),
    Column("parts", Text),  # 0023: a job submitted part by part, while submitting (see jobs.py)
)

# Request and token budgets shared by every process (see budgets.py): the row is the lock a
# reservation takes; the reservations in the window are what the budget has spent.
rate_budgets = Table(
    "rx_rate_budgets",
    metadata,
    Column("endpoint", Text, primary_key=True),
    Column("model", Text, primary_key=True),
    Column("requests_per_minute", Integer),
    Column("tokens_per_minute", BigInteger),
    Column("window_seconds", Float, nullable=False),
    Column("updated_at", DbTime, nullable=False),
    Column("backoff_until", DbTime),
    Column("backoff_streak", Integer, nullable=False, server_default="0"),
)

rate_reservations = Table(
    "rx_rate_reservations",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("endpoint", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("holder", Text),
    Column("tokens", BigInteger, nullable=False),
    Column("reserved_at", DbTime, nullable=False),
    Column("answered_at", DbTime),
    Column("pipeline_id", BigInteger),  # the holder's pipeline and epoch (migration 0021)
    Column("epoch", Integer),
)

# Spend caps per pipeline and per deployment (see spend_caps.py): the cap's row is what a reservation's
# conditional UPDATE takes room from; a reservation is held until its answer's usage settles it.
spend_caps = Table(
    "rx_spend_caps",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("max_tokens", BigInteger),
    Column("max_cost", Float),
    Column("configured_tokens", BigInteger),
    Column("configured_cost", Float),
    Column("spent_tokens", BigInteger, nullable=False, server_default="0"),
    Column("spent_cost", Float, nullable=False, server_default="0"),
    Column("reserved_tokens", BigInteger, nullable=False, server_default="0"),
    Column("reserved_cost", Float, nullable=False, server_default="0"),
    Column("changed_by", Text),
    Column("updated_at", DbTime, nullable=False),
)

spend_reservations = Table(
    "rx_spend_reservations",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("scope", Text, nullable=False),
    Column("pipeline_id", BigInteger, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("ref", Text),
    Column("tokens", BigInteger, nullable=False, server_default="0"),
    Column("cost", Float, nullable=False, server_default="0"),
    Column("reserved_at", DbTime, nullable=False),
)

# Ids of pipelines deleted while rows still pointed at them (migration 0024's trigger notes them): where
# `status` looks for those rows, instead of walking every pipeline id for the ranges no pipeline has.
deleted_pipelines = Table("rx_deleted_pipelines", metadata,
                          Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                 autoincrement=False))

APPLICATION_TABLES = (pipelines, nodes, node_items, queue_items, transitions, events, circuit_breakers,
                      provider_calls, rate_budgets, rate_reservations, call_journal,
                      provider_jobs, spend_caps, spend_reservations)


# Figures kept as the work happens (migration 0017, see aggregates.py): what the metrics and `status` read
# instead of the history. No foreign keys: pruning detail rows keeps them.
def _counts(name: str, keys: tuple[str, ...], counted: str) -> Table:
    return Table(name, metadata, *[Column(k, Text, primary_key=True) for k in keys],
                 Column(counted, BigInteger, nullable=False, server_default="0"),
                 Column("seconds_sum", Float, nullable=False, server_default="0"),
                 Column("seconds_count", BigInteger, nullable=False, server_default="0"))


pipeline_counts = _counts("rx_pipeline_counts", ("deployment", "job_name", "status"), "pipelines")
queue_counts = _counts("rx_queue_counts", ("queue", "status"), "items")
resume_counts = Table("rx_resume_counts", metadata, Column("event", Text, primary_key=True),
                      Column("cause", Text, primary_key=True),
                      Column("transitions", BigInteger, nullable=False, server_default="0"))
finished_items = Table("rx_finished_items", metadata, Column("job_name", Text, primary_key=True),
                       Column("status", Text, primary_key=True),
                       Column("items", BigInteger, nullable=False, server_default="0"))
LEDGER_FIGURES = ("calls", "tokens_in", "tokens_out", "cost", "saved_calls", "saved_tokens", "saved_cost",
                  "wasted_calls", "wasted_tokens", "wasted_cost", "replayed_calls", "in_flight_unknown_calls",
                  "skipped_rows")


def _ledger_figures() -> list[Column[Any]]:
    return [Column(f, Float if f.endswith("cost") else BigInteger, nullable=False, server_default="0")
            for f in LEDGER_FIGURES]


ledger_pipeline_totals = Table(
    "rx_ledger_pipeline_totals", metadata,
    Column("pipeline_id", BigInteger, primary_key=True, autoincrement=False),
    Column("node_name", Text, primary_key=True), Column("model", Text, primary_key=True),
    Column("outcome", Text, primary_key=True), Column("job_name", Text, nullable=False),
    Column("day", Date, nullable=False), *_ledger_figures())
ledger_daily = Table(
    "rx_ledger_daily", metadata, Column("day", Date, primary_key=True), Column("job_name", Text, primary_key=True),
    Column("model", Text, primary_key=True), Column("outcome", Text, primary_key=True), *_ledger_figures())

# A view (migration 0022), not a table of the metadata: the ids of the ledger's calls saved by resume, the one
# definition the cost report, a run's call fates and the roll-ups of finished pipelines all read.
calls_saved_by_resume = table("rx_calls_saved_by_resume", column("call_id", Text))
