"""The call journal's two fenced writes per provider call: one strategy per store, chosen once from its dialect.

Two implementations of the same writes (see journal.py for what each means), writing the same rows and
raising the same exceptions with the same messages:

* :class:`ServerFunctionJournalWrites` (PostgreSQL): ``rx_journal_begin`` / ``rx_journal_answer`` (migration
  0018), prepared once per connection (``hot_path``), one autocommit round trip per write. A journaled
  call's writes were a transaction of four or five round trips each, 2.5 % of a 200 ms call on the test
  machine, more than the 2 % a journal may add;
* :class:`PortableJournalWrites` (any database): the fence and the writes as statements of one transaction.

A **batch** of them (:meth:`JournalWrites.batch`: the begins and answers of the items of one node that are in
flight together, gathered by the journal's group commit) is one transaction: portably the fence once, then
each kind of write as one statement over the batch (the look-ups, the ledger rows written in flight, the
answers kept, the rows completed); on PostgreSQL each write's own function, called per element by one statement
per kind of write over arrays (``journal_answers`` / ``journal_begins``), both sent in one pipeline (one round
trip): a statement per write cost psycopg's pipeline more client CPU than the functions cost the server.
64 items in flight cost a few transactions per round of requests instead of 128 single writes competing for
the database (SQLite has one writer) and, under load, for the GIL at each round trip.

The store calls only :class:`JournalWrites`; nothing else asks which one it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import fields
from typing import Any, Protocol

from sqlalchemy import Connection, FromClause, and_, select, tuple_, update

from recovery_ext._errors import NotFound, OwnershipLost
from recovery_ext._store import hot_path
from recovery_ext._store.database import check_on_sqlite_driver, chunks, lost
from recovery_ext._store.dialects import SQLITE_NOW, Dialect
from recovery_ext._store.ledger import IN_FLIGHT, LedgerWrites, call_row
from recovery_ext._store.models import JournalHit, JournalWrite, Ownership, ProviderCall
from recovery_ext._store.schema import call_journal, pipelines, provider_calls
from recovery_ext._store.statuses import PipelineStatus

pc = provider_calls.c
jc = call_journal.c

_Key = tuple[Any, str, Any]  # (node name, item key, call key) of a journal entry


class JournalHost(Protocol):
    """What the strategies use of the store (the call journal): its transactions and its collaborator ``ledger``
    (the ledger's writes)."""

    dialect: Dialect

    def write(self) -> AbstractContextManager[Connection]: ...
    def driver_autocommit(self) -> AbstractContextManager[Any]: ...
    def driver_of(self, conn: Connection) -> AbstractContextManager[Any]: ...
    @property
    def ledger(self) -> LedgerWrites: ...
    def _complete_calls_in(self, conn: Connection, calls: Sequence[ProviderCall]) -> None: ...


class JournalWrites:
    """A journaled call's fenced writes; see the store's ``journal_begin`` and ``journal_answer``."""

    def __init__(self, db: JournalHost) -> None:
        self.db = db

    def begin(self, own: Ownership, call: ProviderCall, call_key: str | None) -> JournalHit | None:
        raise NotImplementedError

    def answer(self, own: Ownership, call: ProviderCall, call_key: str | None, answer: str | None) -> None:
        raise NotImplementedError

    def batch(self, own: Ownership, writes: Sequence[JournalWrite]) -> list[JournalHit | None | Exception]:
        """``writes`` in one transaction fenced by ``own``'s epoch: each answer kept and its row completed, each
        begin's journaled answer found (its row counts a replay) or its row written in flight. One result per
        write: the hit of a begin that found an answer, else None. A refusal refuses the whole batch."""
        with self.db.write() as conn:
            self._fence_batch(conn, own)
            answers = [w for w in writes if w.answered]
            kept = [w for w in answers if w.call_key is not None and w.answer is not None]
            if kept:
                self._keep_answers(conn, own, kept)
            if answers:
                self._complete(conn, [w.call for w in answers])
            return self._begin_all(conn, own, [w for w in writes if not w.answered], writes)

    # The statements of a batch, one method each: the portable ones here, fixed SQL on SQLite's driver below.

    def _fence_batch(self, conn: Connection, own: Ownership) -> None:
        _fence_and_find(self.db, conn, own, None, "", None)

    def _keep_answers(self, conn: Connection, own: Ownership, kept: list[JournalWrite]) -> None:
        stmt = self.db.dialect.insert(call_journal).values(answered_at=self.db.dialect.now())
        conn.execute(stmt.on_conflict_do_update(  # fresh=True: the new answer replaces the old
            index_elements=[jc.pipeline_id, jc.node_name, jc.item_key, jc.call_key],
            set_={"call_id": stmt.excluded.call_id, "epoch": stmt.excluded.epoch,
                  "answer": stmt.excluded.answer, "answered_at": stmt.excluded.answered_at}),
            [{"pipeline_id": own.pipeline_id, "node_name": w.call.node_name, "item_key": w.call.item_key or "",
              "call_key": w.call_key, "call_id": w.call.id, "epoch": own.epoch, "answer": w.answer}
             for w in kept])

    def _complete(self, conn: Connection, calls: list[ProviderCall]) -> None:
        self.db._complete_calls_in(conn, calls)

    def _journaled(self, conn: Connection, own: Ownership, keyed: list[_Key]
                   ) -> dict[_Key, tuple[str, str]]:
        """The journaled (answer, call_id) of each (node, item, call key) that has one."""
        rows = conn.execute(select(jc.node_name, jc.item_key, jc.call_key, jc.answer, jc.call_id).where(
            jc.pipeline_id == own.pipeline_id, tuple_(jc.node_name, jc.item_key, jc.call_key).in_(keyed)))
        return {(r.node_name, r.item_key, r.call_key): (r.answer, r.call_id) for r in rows}

    def _begin_all(self, conn: Connection, own: Ownership, begins: list[JournalWrite],
                   writes: Sequence[JournalWrite]) -> list[JournalHit | None | Exception]:
        found: dict[_Key, tuple[str, str]] = {}
        keyed = [(w.call.node_name, w.call.item_key or "", w.call_key) for w in begins if w.call_key is not None]
        if keyed:
            found = self._journaled(conn, own, keyed)
        hits: dict[int, JournalHit] = {}
        in_flight: list[ProviderCall] = []
        for w in begins:
            journaled = None if w.call_key is None else found.get((w.call.node_name, w.call.item_key or "",
                                                                    w.call_key))
            row = None if journaled is None else conn.execute(
                update(provider_calls).where(pc.id == journaled[1]).values(replays=pc.replays + 1)
                .returning(*provider_calls.c)).first()
            if row is not None and journaled is not None:
                hits[id(w)] = JournalHit(journaled[0], _call_of(row._mapping))
            else:
                in_flight.append(w.call)
        if in_flight:
            self.db.ledger.write_calls(conn, in_flight, reached=False)
        return [hits.get(id(w)) for w in writes]


def _fence_and_find(db: JournalHost, conn: Connection, own: Ownership, node_name: str | None, item_key: str,
                    call_key: str | None) -> Any:
    """The fence (lock the pipeline row against reclaim, check ``own``'s epoch), the commit without a log
    flush and the journal's look-up in one statement: a journaled call's writes are round trips."""
    p = pipelines.c
    columns = [p.epoch, p.owner, p.status, db.dialect.commit_without_flush().label("no_flush")]
    source: FromClause = pipelines
    if call_key is not None:
        columns += [jc.answer, jc.call_id]
        source = pipelines.outerjoin(call_journal, and_(
            jc.pipeline_id == p.id, jc.node_name == node_name, jc.item_key == item_key, jc.call_key == call_key))
    row = conn.execute(select(*columns).select_from(source).where(p.id == own.pipeline_id)
                       .with_for_update(read=True, key_share=True, of=pipelines)).first()
    if row is None:
        raise NotFound(f"no pipeline {own.pipeline_id}")
    if row.epoch != own.epoch or row.status != PipelineStatus.RUNNING:
        raise lost(own, row.owner, row.epoch, row.status)
    return row


class PortableJournalWrites(JournalWrites):
    def _fence_and_find(self, conn: Connection, own: Ownership, node_name: str | None, item_key: str,
                        call_key: str | None) -> Any:
        return _fence_and_find(self.db, conn, own, node_name, item_key, call_key)

    def begin(self, own: Ownership, call: ProviderCall, call_key: str | None) -> JournalHit | None:
        with self.db.write() as conn:
            found = self._fence_and_find(conn, own, call.node_name, call.item_key or "", call_key)
            if call_key is not None and found.call_id is not None:
                row = conn.execute(update(provider_calls).where(pc.id == found.call_id)
                                   .values(replays=pc.replays + 1).returning(*provider_calls.c)).first()
                if row is not None:
                    return JournalHit(found.answer, _call_of(row._mapping))
            self.db.ledger.write_calls(conn, [call], reached=False)
        return None

    def answer(self, own: Ownership, call: ProviderCall, call_key: str | None, answer: str | None) -> None:
        with self.db.write() as conn:
            self._fence_and_find(conn, own, call.node_name, "", None)
            if call_key is not None and answer is not None:
                stmt = self.db.dialect.insert(call_journal).values(
                    pipeline_id=own.pipeline_id, node_name=call.node_name, item_key=call.item_key or "",
                    call_key=call_key, call_id=call.id, epoch=own.epoch, answer=answer,
                    answered_at=self.db.dialect.now())
                conn.execute(stmt.on_conflict_do_update(  # fresh=True: the new answer replaces the old
                    index_elements=[jc.pipeline_id, jc.node_name, jc.item_key, jc.call_key],
                    set_={"call_id": stmt.excluded.call_id, "epoch": stmt.excluded.epoch,
                          "answer": stmt.excluded.answer, "answered_at": stmt.excluded.answered_at}))
            self.db._complete_calls_in(conn, [call])


# SQLite's batch as fixed SQL on the driver's connection, inside the batch's transaction (BEGIN IMMEDIATE, the
# write gate): building and compiling the portable statements cost more client CPU than running them, and at
# 64 items in flight that CPU (one GIL) is what limits the items' throughput. Same rows, same refusals.
_SQLITE_KEEP = ("INSERT INTO rx_call_journal (pipeline_id, node_name, item_key, call_key, call_id, epoch, answer, "
                f"answered_at) VALUES (?, ?, ?, ?, ?, ?, ?, {SQLITE_NOW}) "
                "ON CONFLICT (pipeline_id, node_name, item_key, call_key) DO UPDATE SET call_id = excluded.call_id, "
                "epoch = excluded.epoch, answer = excluded.answer, answered_at = excluded.answered_at")
_COMPLETED = ("model", "tokens_in", "tokens_out", "latency_seconds", "outcome", "cost", "note")
_SQLITE_COMPLETE = (f"UPDATE rx_provider_calls SET {', '.join(f'{c} = ?' for c in _COMPLETED)} "
                    "WHERE id = ? AND outcome = ?")
_SQLITE_FIND = ("SELECT node_name, item_key, call_key, answer, call_id FROM rx_call_journal "
                "WHERE pipeline_id = ? AND (node_name, item_key, call_key) IN (VALUES {})")


class SqliteJournalWrites(PortableJournalWrites):
    def _fence_batch(self, conn: Connection, own: Ownership) -> None:
        with self.db.driver_of(conn) as raw:
            check_on_sqlite_driver(raw, own)

    def _keep_answers(self, conn: Connection, own: Ownership, kept: list[JournalWrite]) -> None:
        with self.db.driver_of(conn) as raw:
            raw.executemany(_SQLITE_KEEP, [(own.pipeline_id, w.call.node_name, w.call.item_key or "", w.call_key,
                                            w.call.id, own.epoch, w.answer) for w in kept])

    def _complete(self, conn: Connection, calls: list[ProviderCall]) -> None:
        rows = [call_row(call) for call in calls]
        with self.db.driver_of(conn) as raw:
            raw.executemany(_SQLITE_COMPLETE, [(*(r[c] for c in _COMPLETED), r["id"], IN_FLIGHT) for r in rows])

    def _journaled(self, conn: Connection, own: Ownership, keyed: list[_Key]
                   ) -> dict[_Key, tuple[str, str]]:
        found: dict[_Key, tuple[str, str]] = {}
        with self.db.driver_of(conn) as raw:
            for part in chunks(keyed, 500):  # 3 variables each: far below SQLite's limit
                sql = _SQLITE_FIND.format(", ".join(["(?, ?, ?)"] * len(part)))
                for node, item, call_key, answer, call_id in raw.execute(
                        sql, (own.pipeline_id, *(v for key in part for v in key))):
                    found[(node, item, call_key)] = (answer, call_id)
        return found


class ServerFunctionJournalWrites(JournalWrites):
    def begin(self, own: Ownership, call: ProviderCall, call_key: str | None) -> JournalHit | None:
        with self.db.driver_autocommit() as raw:
            row = hot_path.journal_begin(raw, **_fence(own, call, call_key), **call_row(call))
        _refuse_if_fenced_out(own, row)
        if row.verdict == "hit":
            return JournalHit(row.journaled_answer, _call_of(row._asdict()))
        return None

    def answer(self, own: Ownership, call: ProviderCall, call_key: str | None, answer: str | None) -> None:
        with self.db.driver_autocommit() as raw:
            row = hot_path.journal_answer(raw, **_fence(own, call, call_key), **call_row(call), answer=answer,
                                          in_flight=IN_FLIGHT)
        _refuse_if_fenced_out(own, row)

    def batch(self, own: Ownership, writes: Sequence[JournalWrite]) -> list[JournalHit | None | Exception]:
        """Each write's own function, the answers in one statement and the begins in another, both in one pipeline
        (one round trip, one implicit transaction): a write refused by its fence gets its exception as its
        result, the others their own."""
        answers = [w for w in writes if w.answered]
        begins = [w for w in writes if not w.answered]
        with self.db.driver_autocommit() as raw:
            begun, answered = hot_path.journal_batch(
                raw, {"fence_pipeline": own.pipeline_id, "fence_epoch": own.epoch},
                begins=[_batched(w) for w in begins],
                answers=[{**_batched(w, with_call_row=False), "answer": w.answer, **_completed(w.call)}
                         for w in answers], in_flight=IN_FLIGHT)
        row_of = {id(w): row for w, row in zip(begins, begun, strict=True)}
        row_of.update((id(w), row) for w, row in zip(answers, answered, strict=True))
        results: list[JournalHit | None | Exception] = []
        for write in writes:
            row = row_of[id(write)]
            try:
                _refuse_if_fenced_out(own, row)
            except (NotFound, OwnershipLost) as exc:
                results.append(exc)
                continue
            hit = not write.answered and row.verdict == "hit"
            results.append(JournalHit(row.journaled_answer, _call_of(row._asdict())) if hit else None)
        if all(isinstance(result, Exception) for result in results):
            raise results[0]  # type: ignore[misc]  # refused as a whole, as the portable fence refuses it
        return results


def _batched(write: JournalWrite, *, with_call_row: bool = True) -> dict[str, Any]:
    """One write's elements of a batch statement: where it looks up or keeps its answer, and its ledger row."""
    keyed = {"node": write.call.node_name, "item": write.call.item_key or "", "call_key": write.call_key}
    return {**keyed, **call_row(write.call)} if with_call_row else {**keyed, "id": write.call.id}


def _completed(call: ProviderCall) -> dict[str, Any]:
    """The ledger columns an answer completes."""
    row = call_row(call)
    return {name: row[name] for name in _COMPLETED}


def journal_writes_for(db: JournalHost) -> JournalWrites:
    """The one choice: the server's functions where its migrations made them, else the portable statements."""
    if db.dialect.journal_functions:
        return ServerFunctionJournalWrites(db)
    return SqliteJournalWrites(db) if db.dialect.ledger_rows_via_driver else PortableJournalWrites(db)


def _fence(own: Ownership, call: ProviderCall, call_key: str | None) -> dict[str, Any]:
    """Where the function fences and what it looks up or keeps under (as the portable path's statements do)."""
    return {"fence_pipeline": own.pipeline_id, "fence_epoch": own.epoch, "node": call.node_name,
            "item": call.item_key or "", "call_key": call_key}


def _refuse_if_fenced_out(own: Ownership, row: Any) -> None:
    """The portable fence's exceptions, from what the function found instead of writing."""
    if row.verdict == "no_pipeline":
        raise NotFound(f"no pipeline {own.pipeline_id}")
    if row.verdict == "lost":
        raise lost(own, row.pipeline_owner, row.pipeline_epoch, row.pipeline_status)


_CALL_FIELDS = {f.name for f in fields(ProviderCall) if f.init and not f.kw_only}


def _call_of(row: Any) -> ProviderCall:
    return ProviderCall(**{k: v for k, v in row.items() if k in _CALL_FIELDS})
