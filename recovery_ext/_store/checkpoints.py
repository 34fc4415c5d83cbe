"""Item checkpoints: a node records each finished item and its result, so a resume skips it.

Every checkpoint is fenced by the owner's epoch in the statement or transaction that writes
it, never after. A completed item is never overwritten (the call is refused with
:class:`~recovery_ext._errors.IllegalTransition` and writes nothing); a degraded one (a
fallback answer) may be redone. A batch commits as a whole or not at all.

PostgreSQL runs fixed statements (``sql/postgres/queries``): the fence, the insert and the
stall-deadline push as data-modifying CTEs of ONE statement, a batch's items bound as
arrays. Without ``also=`` writes that statement is the whole call, in autocommit mode,
run on the pooled psycopg connection (prepared once per connection): at these rates
SQLAlchemy's per-execute work and psycopg's parsing of a many-row VALUES list are most
of the cost. It is first tried as a plain INSERT of new items, the usual case; a batch
naming an item that has a row already is then decided by the statement with ON CONFLICT.
With ``also=`` writes it runs last in the fenced transaction that ran them, and
its COMMIT goes in the same round trip: a superseded owner's statement fails, so that COMMIT
never commits its writes.
SQLite writes a batch with one multi-row INSERT in a ``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any, NoReturn

from sqlalchemy import Connection, select

from recovery_ext._store.database import Component, Database, Fence, check_on_sqlite_driver, is_retry, retried
from recovery_ext._store.dialects import SQLITE_NOW, Dialect, sqlstate
from recovery_ext._errors import ConfigurationError, IllegalTransition, OwnershipLost, StoreError
from recovery_ext._store.hot_path import statement_cursor
from recovery_ext._store.migrations import load_query
from recovery_ext._store.ledger import LedgerWrites, call_row
from recovery_ext._store.models import FencedTransaction, ItemCheckpoint, JsonText, Ownership, ProviderCall
from recovery_ext._conventions import storable_json
from recovery_ext._store.schema import node_items
from recovery_ext._store.statuses import ItemStatus, NodeStatus
from recovery_ext._store.pipelines import PipelineCore, stall_push

UNIQUE_VIOLATION = "23505"
SUPERSEDED = "RX409"  # raised by rx_superseded() (migration 0009) when a checkpoint's fence finds no row


# SQLite's checkpoint batch (see Checkpoints._checkpoint_rows): a degraded item (a fallback answer) may be redone,
# a completed one never (its row is left as it is, so the batch writes fewer rows than it has entries).
_SQLITE_CHECKPOINT = (
    "INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at) "
    f"VALUES (?, ?, ?, ?, ?, ?, ?, {SQLITE_NOW}) ON CONFLICT (pipeline_id, node_name, item_key) DO UPDATE SET "
    "status = excluded.status, result = excluded.result, run_id = excluded.run_id, epoch = excluded.epoch, "
    "completed_at = excluded.completed_at WHERE rx_node_items.status = ?")
# SQLite's stall push, by the rule of pipelines.stall_push (as _checkpoint_progress.sql's on PostgreSQL)
_SQLITE_STALL = (f"UPDATE rx_nodes SET stall_deadline = {SQLITE_NOW} + ? "
                 "WHERE pipeline_id = ? AND name = ? AND status = ? "
                 f"AND (stall_deadline IS NULL OR stall_deadline < {SQLITE_NOW} + ?)")


class _Refused(Exception):
    """A checkpoint statement named an item that is already checkpointed (its transaction rolls back)."""


class _Superseded(Exception):
    """The batch statement's fence found another owner or epoch: the statement failed (SQLSTATE RX409)
    and its transaction rolls back."""


class Checkpoints(Component):
    """Item checkpoints (a part of ``store.pipelines``). Its collaborators: ``rows`` (the pipeline moves every
    component shares, and ``rows.transitions``: how this store's nodes start and read their items), ``fence``
    (the owner's lock and epoch check) and ``ledger`` (the provider calls a checkpoint keeps)."""

    def __init__(self, db: Database, *, rows: PipelineCore, fence: Fence, ledger: LedgerWrites) -> None:
        super().__init__(db)
        self.rows = rows
        self.fence = fence
        self.ledger = ledger

    # -- items of a node ---------------------------------------------------------------------

    @retried
    def start_items(self, own: Ownership, node_name: str, total: int) -> dict[str, str]:
        """Record the node's item total and read the statuses of its checkpointed items, in one transaction
        (on PostgreSQL one autocommit statement: the fence, the update and the read as CTEs)."""
        return self.rows.transitions.start_items(own, node_name, total)

    @retried
    def completed_items(self, pipeline_id: int, node_name: str) -> dict[str, Any]:
        return self.rows.transitions.completed_items(pipeline_id, node_name)

    # -- checkpoints -------------------------------------------------------------------------

    @retried
    def checkpoint_item(self, own: Ownership, node_name: str, entry: ItemCheckpoint, *,
                        stall_timeout: float | None = None) -> None:
        """Record one item as done: its result, ``also``'s writes and the provider ``calls`` whose answers it
        keeps (marked reached_checkpoint in the ledger), in the same transaction.

        Without ``also`` on PostgreSQL this is one statement in autocommit mode: one round
        trip for the fence, the insert and the progress update together (an item that keeps no
        call binds scalars: the batch statement's JSON arrays cost it 6-8 %).
        """
        self._write_checkpoints(own, node_name, [entry], stall_timeout)  # one key: never named twice

    @retried
    def checkpoint_items(self, own: Ownership, node_name: str, entries: Sequence[ItemCheckpoint], *,
                         stall_timeout: float | None = None) -> None:
        """Record a batch of items in ONE fenced transaction: every ``also`` write, every result and
        checkpoint commit together or not at all, so a crash redoes at most this batch."""
        entries = list(entries)
        if not entries:
            return
        if len(set(map(_KEY, entries))) != len(entries):
            raise IllegalTransition(f"a checkpoint batch of node {node_name!r} names an item twice")
        self._write_checkpoints(own, node_name, entries, stall_timeout)

    def _write_checkpoints(self, own: Ownership, node_name: str, entries: list[ItemCheckpoint],
                           stall_timeout: float | None) -> None:
        """Checkpoint ``entries`` (at least one, each key once) the way this database and these entries need; a
        key this database's text cannot store refuses the whole call, before any write, with the words of
        ``ctx.items`` instead of the driver's error (a UnicodeEncodeError, a DataError)."""
        unstorable = self.dialect.first_unstorable(list(map(_KEY, entries)))
        if unstorable is not None:
            key, why = unstorable
            raise ConfigurationError(f"node {node_name!r}: item key {key[:80]!r} {why}; nothing was "
                                     "written (give each item a short key of plain text)")
        if not self.dialect.dml_in_cte:
            self._checkpoint_rows(own, node_name, entries, stall_timeout)
        elif list(map(_ALSO, entries)).count(None) != len(entries):
            batch = _batch_params(own, node_name, entries, stall_timeout, self.dialect)
            self._checkpoint_after_also(own, node_name, entries, batch)
        else:
            self._checkpoint_in_one_statement(own, node_name, entries, stall_timeout)

    def _checkpoint_in_one_statement(self, own: Ownership, node_name: str, entries: list[ItemCheckpoint],
                                     stall_timeout: float | None) -> None:
        """PostgreSQL: the whole call is one autocommit statement; a refused batch aborts it (nothing written).

        The first statement assumes every item is new (a plain INSERT: the conflict handling costs the
        server about a quarter of a large batch). Items that keep no provider call go without the ledger's CTE
        (its statement triggers fire even for no row); those that push no stall deadline either go without any
        CTE: one item as one INSERT ... SELECT of scalars, a batch as one INSERT of its three JSON arrays under
        the fence (one item that pushes a stall deadline binds its scalars too). If an item has a row already,
        that statement fails and wrote nothing, and the full statement decides: a degraded item is redone, a
        completed one refuses the batch. Only a batch naming a checkpointed item pays that second round trip.
        """
        first = entries[0]
        calls = any(map(_CALLS, entries))
        batch = None
        if len(entries) == 1 and not calls:
            # Plain str values, an ItemStatus as its value and a JsonText as a str: psycopg looks a subclass's
            # dumper up by walking its classes, about 4 us each of a one-item checkpoint's client CPU.
            status = getattr(first.status, "value", first.status)
            params = {**_fence_params(own, node_name), "key": first.key, "status": status,
                      "result": str(_json(first.result))}
            query = "checkpoint_new_item"
            if stall_timeout:  # its scalars, not three one-element JSON arrays: a third less client CPU
                query = "checkpoint_new_item_stall"
                params["stall"], params["stall_to"] = stall_push(stall_timeout)
        elif stall_timeout or calls:
            batch = _batch_params(own, node_name, entries, stall_timeout, self.dialect)
            query, params = "checkpoint_new_items" if calls else "checkpoint_new_items_no_calls", batch
        else:
            query, params = "checkpoint_new_items_plain", _item_params(own, node_name, entries)
        try:
            with self.driver_autocommit() as raw:
                try:
                    written = self._checkpoint_statement(raw, params, query=query)
                except _Refused:  # an item has a row already: the full statement decides, item by item
                    batch = batch or _batch_params(own, node_name, entries, stall_timeout, self.dialect)
                    written = self._checkpoint_statement(raw, batch)
        except _Refused:
            written = 0
        except _Superseded:
            self._superseded(own)
        if written < len(entries):
            self._refuse(own, node_name, [e.key for e in entries])

    def _checkpoint_statement(self, raw: Any, params: dict[str, Any], *, commit: bool = False,
                              query: str = "checkpoint_items") -> int:
        """The batch statement on the driver connection, prepared (parsed and planned once per connection,
        then only bound and executed); returns how many items it wrote. :class:`_Refused` when it named a
        completed item, :class:`_Superseded` when its fence found another owner or epoch: either way the
        statement failed, so it wrote nothing. (``checkpoint_new_item``, ``checkpoint_new_item_stall`` and
        ``checkpoint_new_items_plain`` are INSERTs that return no row: when the fence finds no row they insert
        none, read as superseded.)

        With ``commit``, the transaction's COMMIT travels in the same round trip (psycopg's pipeline
        mode: one Sync for both). That is safe because a superseded or refused statement fails: the
        server then skips the COMMIT, the transaction stays aborted and the caller's rollback takes
        the ``also=`` writes with it. (The caller's own commit afterwards finds nothing to do.)
        """
        query = load_query(self.dialect.migrations_folder, query)
        try:
            if not commit:
                cursor = statement_cursor(raw).execute(query, params, prepare=True)
                if cursor.description is None:  # a plain INSERT (checkpoint_new_item*): no row means no fence
                    if cursor.rowcount == 0:
                        raise _Superseded()
                    return int(cursor.rowcount)
                return int(cursor.fetchone()[0])
            with raw.pipeline():  # its exit sends the one Sync and reads both results
                cursor = raw.execute(query, params, prepare=True)
                raw.execute("COMMIT")  # not raw.commit(): that syncs at once, and the exit would sync again
            return int(cursor.fetchone()[0])
        except self.engine.dialect.loaded_dbapi.Error as exc:
            code = sqlstate(exc)
            if code == UNIQUE_VIOLATION:
                raise _Refused() from exc
            if code == SUPERSEDED:
                raise _Superseded() from exc
            raise

    def _checkpoint_after_also(self, own: Ownership, node_name: str, entries: list[ItemCheckpoint],
                               params: dict[str, Any]) -> None:
        """PostgreSQL with ``also=`` writes: one transaction runs them, then the batch statement and the
        COMMIT in one round trip; the statement's fence decides whether anything commits.

        The fence comes last here, not first: its FOR KEY SHARE lock on the pipeline row is held
        from the batch statement to the commit, so a reclaim cannot slip in between, and a
        superseded owner's statement fails (SQLSTATE RX409), so its transaction (its ``also=``
        writes included) is rolled back, never committed. That saves the separate fence round trip
        per item. Lock order stays safe: a reclaim never waits for a worker's locks (it skips locked
        rows), and the only lock taken on the pipeline row is this one, never upgraded.
        """
        try:
            with self.write() as conn:
                if is_retry() and self._checkpointed_by(conn, own, node_name, entries[0].key):
                    return  # the batch is atomic: the first attempt committed before its connection dropped
                self._run_also(conn, own, entries)
                with self.driver_of(conn) as raw:  # in this transaction
                    written = self._checkpoint_statement(raw, params, commit=True)
        except _Refused:
            self._refuse(own, node_name, [e.key for e in entries])  # the rollback took the also= writes too
            return
        except _Superseded:
            self._superseded(own)
        if written < len(entries):  # pragma: no cover - the statement either writes all or aborts
            raise StoreError(f"checkpoint batch of node {node_name!r}: {written} of {len(entries)} written")

    def _superseded(self, own: Ownership) -> NoReturn:
        self.rows.check_ownership(own)  # raises OwnershipLost (or NotFound) with who owns it now
        raise OwnershipLost(owner="(changed during the checkpoint)", pipeline_id=own.pipeline_id) from None

    def _checkpoint_rows(self, own: Ownership, node_name: str, entries: list[ItemCheckpoint],
                         stall_timeout: float | None) -> None:
        """SQLite: the fence, ``also=`` writes, a multi-row INSERT and the stall push in one transaction (BEGIN
        IMMEDIATE), as fixed SQL on the driver's connection: building and compiling the statements cost more
        client CPU than running them, and with 64 items in flight that CPU (one GIL) limits the items' rate.

        A batch naming a completed item writes fewer rows than it has entries: it rolls back whole, and
        :meth:`_refuse` names the item (as on PostgreSQL)."""
        keys = [e.key for e in entries]
        try:
            with self.write() as conn:
                with self.driver_of(conn) as raw:
                    check_on_sqlite_driver(raw, own)
                if is_retry() and self._checkpointed_by(conn, own, node_name, keys[0]):
                    return  # the batch is atomic: the first attempt committed before its connection dropped
                self._run_also(conn, own, entries)
                self.ledger.write_calls(conn, _kept_calls(own, node_name, entries), reached=True)
                bind = self.dialect.bind_json
                with self.driver_of(conn) as raw:
                    written = raw.executemany(_SQLITE_CHECKPOINT, [
                        (own.pipeline_id, node_name, e.key, e.status, bind(e.result), own.owner, own.epoch,
                         ItemStatus.DEGRADED) for e in entries]).rowcount
                    if written < len(entries):
                        raise _Refused()  # the write transaction rolls back: nothing of the batch is kept
                    if stall_timeout:
                        at_least, pushed_to = stall_push(stall_timeout)
                        raw.execute(_SQLITE_STALL, (pushed_to, own.pipeline_id, node_name, NodeStatus.RUNNING,
                                                    at_least))
        except _Refused:
            self._refuse(own, node_name, keys)

    def _run_also(self, conn: Connection, own: Ownership, entries: list[ItemCheckpoint]) -> None:
        tx = FencedTransaction(self, conn, own)
        try:
            for entry in entries:
                if entry.also is not None:
                    entry.also(tx)
        finally:
            tx.close()

    def _refuse(self, own: Ownership, node_name: str, keys: list[str]) -> None:
        """A checkpoint named an item already checkpointed: nothing was written. Returns quietly when
        this is a retry whose first attempt committed (the same owner and epoch wrote the items)."""
        with self.read() as conn:
            if is_retry() and self._checkpointed_by(conn, own, node_name, keys[0]):
                return  # the first attempt committed before its connection dropped
            done = set(conn.scalars(select(node_items.c.item_key).where(
                node_items.c.pipeline_id == own.pipeline_id, node_items.c.node_name == node_name,
                node_items.c.item_key.in_(keys), node_items.c.status != ItemStatus.DEGRADED)))
        refused = [k for k in keys if k in done] or keys
        raise IllegalTransition(_already(own, node_name, refused[0]))

    @staticmethod
    def _checkpointed_by(conn: Connection, own: Ownership, node_name: str, item_key: str) -> bool:
        row = conn.execute(select(node_items.c.run_id, node_items.c.epoch).where(
            node_items.c.pipeline_id == own.pipeline_id, node_items.c.node_name == node_name,
            node_items.c.item_key == item_key)).first()
        return row is not None and row.run_id == own.owner and row.epoch == own.epoch


def _kept_calls(own: Ownership, node_name: str, entries: Sequence[ItemCheckpoint]) -> list[ProviderCall]:
    """The provider calls whose answers a checkpoint batch keeps, bound to its pipeline, node, run and epoch."""
    return [call if (call.pipeline_id, call.node_name, call.item_key, call.run_id, call.epoch)
            == (own.pipeline_id, node_name, entry.key, own.owner, own.epoch)  # bound by the node already
            else replace(call, pipeline_id=own.pipeline_id, node_name=node_name, item_key=call.item_key or entry.key,
                         run_id=own.owner, epoch=own.epoch)
            for entry in entries for call in entry.calls]


# An item's fields, read for a whole batch at C speed (a batch of 1,000 items spends most of its client time on
# per-item work): map(_CALLS, entries) instead of a generator over the entries.
_KEY, _RESULT, _STATUS, _ALSO, _CALLS = map(attrgetter, ("key", "result", "status", "also", "calls"))


def _batch_params(own: Ownership, node_name: str, entries: Sequence[ItemCheckpoint],
                  stall_timeout: float | None, dialect: Dialect) -> dict[str, Any]:
    """The parameters of checkpoint_items.sql and checkpoint_new_items*.sql: the items and their calls as JSON."""
    at_least, pushed_to = stall_push(stall_timeout) if stall_timeout else (None, None)
    return {**_item_params(own, node_name, entries), "stall": at_least, "stall_to": pushed_to,
            **_calls_json(entries, dialect)}


def _fence_params(own: Ownership, node_name: str) -> dict[str, Any]:
    """What every checkpoint statement's fence and rows are bound by: the pipeline, its owner's epoch, the node."""
    return {"pipeline": own.pipeline_id, "epoch": own.epoch, "owner": own.owner, "node": node_name}


def _item_params(own: Ownership, node_name: str, entries: Sequence[ItemCheckpoint]) -> dict[str, Any]:
    """The fence's parameters and the items as three JSON array texts (_checkpoint_items.sql;
    checkpoint_new_items_plain.sql binds only these). Each result is JSON text already: joined, not re-encoded."""
    # ensure_ascii=False: each key as its own characters (also cheaper); a key holding half of a surrogate pair
    # fails the bind, as it fails the one-item statement, instead of being stored as the pair's one character
    results = list(map(_RESULT, entries))
    if set(map(type, results)) != {JsonText}:  # ctx.items encoded every result already: the usual batch
        results = [_json(result) for result in results]
    return {**_fence_params(own, node_name), "keys": json.dumps(list(map(_KEY, entries)), ensure_ascii=False),
            "statuses": json.dumps(list(map(_STATUS, entries)), ensure_ascii=False),
            "results": "[" + ",".join(results) + "]"}


# The ledger columns a checkpoint statement takes from each call (_checkpoint_calls.sql); the pipeline, node, run
# and epoch are the fence's.
_CALL_FIELDS = ("id", "item_key", "endpoint", "model", "tokens_in", "tokens_out", "latency_seconds", "outcome", "cost",
                "note")


def _calls_json(entries: Sequence[ItemCheckpoint], dialect: Dialect) -> dict[str, str]:
    """The batch statement's ledger rows as one JSON array of objects ("[]" when no call is kept). Their numbers
    are finite (ProviderCall refuses others), so the JSON is valid."""
    calls = [call_row(call) | {"item_key": call.item_key or entry.key} for entry in entries for call in entry.calls]
    if not calls:  # the usual item of a node with a stall timeout: nothing to encode
        return {"calls": "[]"}
    for row in calls:  # a call recorded for a key no item could have, kept as write_calls keeps it
        row["item_key"] = dialect.storable_call_key(row["item_key"])
    return {"calls": json.dumps([{field: row[field] for field in _CALL_FIELDS} for row in calls], allow_nan=False)}


def _already(own: Ownership, node_name: str, key: str) -> str:
    return f"item {key!r} of node {node_name!r} in pipeline {own.pipeline_id} is already checkpointed"


def _json(value: Any) -> str:
    """An item result as JSON text for the statement's ``::jsonb`` (None is JSON null, as SQLAlchemy writes it)."""
    if type(value) is JsonText:
        return value
    try:
        return storable_json(value)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"an item result must be JSON: {exc}") from exc
