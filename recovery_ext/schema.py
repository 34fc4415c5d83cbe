"""The application tables as SQLAlchemy Core objects.

The migrations in ``sql/<dialect>/`` create these tables; ``tests/test_migrations.py``
proves the two agree. Two column types hide the dialect differences: :class:`DbTime`
(``timestamptz`` on PostgreSQL, epoch seconds on SQLite) and :class:`DbJson`
(``jsonb`` on PostgreSQL, text on SQLite).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

PIPELINE_STATUSES = ("pending", "running", "completed", "failed", "canceled")
NODE_STATUSES = ("pending", "running", "completed", "failed", "degraded", "skipped")
# A running pipeline paused by a provider outage (waiting_until set) is shown as this; its
# status stays "running" so liveness, fencing and orphan detection treat it like any live pipeline.
WAITING = "waiting"
ITEM_STATUSES = ("completed", "degraded")
BREAKER_STATES = ("closed", "open", "half_open")
QUEUE_STATUSES = ("ready", "processing", "completed", "failed", "dead")
FINISHED_PIPELINE_STATUSES = ("completed", "failed", "canceled")


@dataclass(frozen=True)
class CorruptJson:
    """A JSON column whose text does not parse (only possible on SQLite)."""

    raw: str
    error: str


class DbTime(TypeDecorator):
    """An aware UTC timestamp; epoch seconds on SQLite so the database clock can compare it."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Float())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value, dialect):
        if value is None or dialect.name != "sqlite":
            return value
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.timezone.utc)
            return value.timestamp()
        return float(value)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if dialect.name == "sqlite":
            try:
                return dt.datetime.fromtimestamp(float(value), tz=dt.timezone.utc)
            except (TypeError, ValueError, OverflowError, OSError):
                # Text or an absurd number in a time column: readable, never a traceback; the scan fails the row.
                return dt.datetime.min.replace(tzinfo=dt.timezone.utc)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value


class DbJson(TypeDecorator):
    """JSON; a value that does not parse comes back as :class:`CorruptJson` instead of raising."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value, dialect):
        if dialect.name == "postgresql":
            return value
        if value is None:
            return None
        return json.dumps(value, separators=(",", ":"), default=str)

    def process_result_value(self, value: Any, dialect):
        if dialect.name == "postgresql" or value is None:
            return value
        try:
            return json.loads(value)
        except (TypeError, ValueError) as exc:
            return CorruptJson(raw=str(value)[:200], error=str(exc))


metadata = MetaData()

migrations_table = Table(
    "rx_schema_migrations",
    metadata,
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
)

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
    UniqueConstraint("pipeline_id", "name", name="rx_nodes_pipeline_name"),
)

node_items = Table(
    "rx_node_items",
    metadata,
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

APPLICATION_TABLES = (pipelines, nodes, node_items, queue_items, transitions, events, circuit_breakers)
