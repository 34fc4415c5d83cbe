"""The hot path of a recoverable node on PostgreSQL, one round trip per step.

``sql/postgres/0008_node_functions.sql`` defines ``rx_begin_node`` and ``rx_complete_node``: the
statements the store otherwise sends one by one inside a transaction (lock the pipeline row,
read the node, move it, record the transition, refresh or finish the pipeline), in the same
order, in one autocommit round trip. ``START_ITEMS`` is ``ctx.items()``'s start as one statement.
On a busy machine every round trip waits for the server process to be scheduled, so this is
most of what a recoverable op costs when nothing fails. The store raises the same exceptions
with the same messages as its multi-statement path (SQLite, in process, uses that one).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, Connection, Float, Integer, Text, bindparam, column, text
from sqlalchemy.dialects.postgresql import ARRAY

from .schema import DbJson, nodes

BEGIN_NODE = text(
    "SELECT r.outcome, r.pipeline, r.pipeline_epoch, r.from_status, (r.node).* FROM rx_begin_node("
    "CAST(:run_id AS TEXT), CAST(:name AS TEXT), :sources, :heartbeat_timeout, :stall_timeout, :retry) AS r"
).bindparams(
    bindparam("sources", type_=ARRAY(Text)), bindparam("heartbeat_timeout", type_=Float),
    bindparam("stall_timeout", type_=Float), bindparam("retry", type_=Boolean),
).columns(column("outcome", Text), column("pipeline", Integer), column("pipeline_epoch", Integer), column("from_status", Text), *nodes.c)

COMPLETE_NODE = text(
    "SELECT r.outcome, r.status, r.owner, r.epoch, r.unfinished, r.total FROM rx_complete_node("
    "CAST(:pipeline_id AS BIGINT), CAST(:epoch AS INTEGER), CAST(:owner AS TEXT), CAST(:name AS TEXT), :output, "
    ":sources, :item_statuses, :heartbeat_timeout, :retry) AS r"
).bindparams(
    bindparam("output", type_=DbJson), bindparam("sources", type_=ARRAY(Text)),
    bindparam("item_statuses", type_=ARRAY(Text)), bindparam("heartbeat_timeout", type_=Float),
    bindparam("retry", type_=Boolean),
).columns(column("outcome", Text), column("status", Text), column("owner", Text), column("epoch", Integer),
          column("unfinished", Integer), column("total", Integer))


# ctx.items(keys) starting: fence, the node's item count and the statuses already checkpointed. The
# first row says whether the fence held; the others are the items. The update runs even though
# the final SELECT does not read it (PostgreSQL always runs data-modifying CTEs).
START_ITEMS = text(
    "WITH fence AS (SELECT p.id FROM rx_pipelines p WHERE p.id = CAST(:pipeline_id AS BIGINT) "
    "AND p.epoch = CAST(:epoch AS INTEGER) AND p.status = 'running' FOR KEY SHARE), "
    "counted AS (UPDATE rx_nodes n SET items_total = CAST(:total AS INTEGER) "
    "WHERE n.pipeline_id = (SELECT id FROM fence) AND n.name = CAST(:node AS TEXT) RETURNING n.id) "
    "SELECT 0 AS position, (SELECT count(*) FROM fence) AS fenced, NULL AS item_key, NULL AS status "
    "UNION ALL SELECT 1, 1, i.item_key, i.status FROM rx_node_items i JOIN fence ON i.pipeline_id = fence.id "
    "WHERE i.node_name = CAST(:node AS TEXT) ORDER BY position"
).columns(column("position", Integer), column("fenced", Integer), column("item_key", Text), column("status", Text))


def begin_node(conn: Connection, **params: Any):
    """One row: ``outcome`` (no_pipeline, no_node, finished, illegal, started), the epoch, the node's status
    before, and the node's columns as they are now."""
    return conn.execute(BEGIN_NODE, params).one()


def complete_node(conn: Connection, **params: Any):
    """One row: ``outcome`` (no_pipeline, pipeline_finished, lost, no_node, unfinished, illegal, completed,
    pipeline_completed) and what the store needs to explain a refusal."""
    return conn.execute(COMPLETE_NODE, params).one()
