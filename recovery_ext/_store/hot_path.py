"""The hot path of a recoverable node on PostgreSQL: one round trip per step, prepared once.

``sql/postgres/0008_node_functions.sql`` defines ``rx_begin_node`` and ``rx_complete_node``: the
statements the store otherwise sends one by one inside a transaction (lock the pipeline row,
read the node, move it, record the transition, refresh or finish the pipeline), in the same
order, in one autocommit round trip. ``start_items`` is ``ctx.items()``'s start as one statement;
``breaker_state`` is the circuit-breaker read before a provider call (a node reuses a closed one for
``breaker_refresh`` seconds). ``journal_begin`` / ``journal_answer`` are a journaled provider call's two
fenced writes, ``rx_journal_begin`` / ``rx_journal_answer`` (``sql/postgres/0018_journal_functions.sql``).

The statements are fixed SQL (``sql/postgres/queries``) run on the pooled psycopg connection
with ``prepare=True``: parsed and planned once per connection, then only bound and executed.
Building a SQLAlchemy statement and running it through the ORM-free Core path still cost
0.7-1.8 ms of client CPU per call on this project's 2-core test machine, more than the round
trip itself; a recoverable op makes about a dozen such calls, and a provider call one more.
The store raises the same exceptions with the same messages as its multi-statement path
(SQLite, in process, uses that one).
"""

from __future__ import annotations

import json
from typing import Any

from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb

from recovery_ext._conventions import storable_json
from recovery_ext._store.migrations import load_query

FOLDER = "postgres"


# Each driver connection's cursor for its small one-row statements, made once: psycopg's ``conn.execute`` makes a
# cursor per call, with an adapter map and a transformer of its own that looks each parameter's dumper up
# again, about 15 us of client CPU per statement (a twentieth of a one-item checkpoint); a kept cursor keeps
# its dumpers. A connection is used by one thread at a time (a pool checkout, or the database's kept
# connection), so its cursor is too. The cursor is kept on the connection itself (psycopg's connections take
# attributes), so it goes with it: a cursor refers to its connection, so a table of cursors beside them
# would keep every connection it ever saw alive.
_CURSOR = "_rx_statement_cursor"


def statement_cursor(raw: Any) -> Any:
    """``raw``'s cursor for statements that return one small row or none (rows as named tuples). A statement that
    can return many rows, or one large row (a node's output, a journaled answer), takes a cursor of its own
    (:func:`_rows`, closed at once): a kept cursor holds its last result in libpq's memory until the next
    statement on its connection, which may idle in the pool."""
    cursor = getattr(raw, _CURSOR, None)
    if cursor is None or cursor.closed:
        cursor = raw.cursor(row_factory=namedtuple_row)
        setattr(raw, _CURSOR, cursor)
    return cursor


def _row(raw: Any, query: str, params: dict[str, Any]) -> Any:
    """The one row ``query`` returns (None when it returns none), on the connection's statement cursor."""
    return statement_cursor(raw).execute(load_query(FOLDER, query), params, prepare=True).fetchone()


def _rows(raw: Any, query: str, params: dict[str, Any]) -> list[Any]:
    with raw.cursor(row_factory=namedtuple_row) as cursor:
        cursor.execute(load_query(FOLDER, query), params, prepare=True)
        rows: list[Any] = cursor.fetchall()
        return rows


def begin_node(raw: Any, **params: Any) -> Any:
    """One row: ``outcome`` (no_pipeline, no_node, finished, illegal, started), the epoch, the node's status
    before, and the node's columns as they are now."""
    return _rows(raw, "begin_node", params)[0]  # the node's columns hold its output: a cursor of its own


def complete_node(raw: Any, *, output: Any, **params: Any) -> Any:
    """One row: ``outcome`` (no_pipeline, pipeline_finished, lost, no_node, unfinished, illegal, completed,
    pipeline_completed) and what the store needs to explain a refusal."""
    return _row(raw, "complete_node", {**params, "output": Jsonb(output, dumps=storable_json)})


def start_items(raw: Any, **params: Any) -> list[Any]:
    """First row: whether the fence held (``fenced``); then one row per checkpointed item and its status."""
    return _rows(raw, "start_items", params)


def completed_items(raw: Any, **params: Any) -> dict[str, Any]:
    return {row.item_key: row.result for row in _rows(raw, "completed_items", params)}


def breaker_state(raw: Any, endpoint: str) -> Any:
    """The endpoint's breaker row (state, consecutive_failures, open_left, probe_left), or None."""
    return _row(raw, "breaker_state", {"endpoint": endpoint})


def journal_begin(raw: Any, **params: Any) -> Any:
    """One row: ``verdict`` (no_pipeline, lost, hit, written), the pipeline's owner, epoch and status (to explain
    a refusal), the journaled answer and the columns of the ledger row that paid for it (a hit)."""
    return _rows(raw, "journal_begin", params)[0]  # the journaled answer: a cursor of its own


def journal_answer(raw: Any, **params: Any) -> Any:
    """One row: ``verdict`` (no_pipeline, lost, written) and the pipeline's owner, epoch and status."""
    return _row(raw, "journal_answer", params)


def journal_batch(raw: Any, fence: dict[str, Any], begins: list[dict[str, Any]], answers: list[dict[str, Any]],
                  in_flight: str) -> tuple[list[Any], list[Any]]:
    """A batch of journal writes under one fence (``fence_pipeline``, ``fence_epoch``): the answers as one statement
    (``journal_answers``), then the begins as one (``journal_begins``), each write's function called per element in
    order and fencing itself as alone; both sent in one pipeline (one round trip, one implicit transaction: a single
    Sync ends it). One row per write, as :func:`journal_answer` / :func:`journal_begin` return it, in their order.

    Each statement's writes are bound as one JSON array (``writes``); their numbers are finite (ProviderCall
    refuses others), so the JSON is valid."""
    statements = [(name, {**fence, "writes": json.dumps(writes, ensure_ascii=False, allow_nan=False), **extra})
                  for name, writes, extra in (("journal_answers", answers, {"in_flight": in_flight}),
                                              ("journal_begins", begins, {})) if writes]
    cursors = []
    try:
        with raw.pipeline():
            for query, params in statements:
                cursor = raw.cursor(row_factory=namedtuple_row)
                cursors.append(cursor)
                cursor.execute(load_query(FOLDER, query), params, prepare=True)
        rows = {query: cursor.fetchall() for (query, _), cursor in zip(statements, cursors, strict=True)}
        return rows.get("journal_begins", []), rows.get("journal_answers", [])
    finally:
        for cursor in cursors:
            cursor.close()

