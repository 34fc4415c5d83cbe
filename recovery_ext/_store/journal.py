"""The call journal and the ledger's started calls: what makes a provider answer paid for once.

A journaled call goes through three writes, each one transaction:

* :meth:`JournalOps.journal_begin`, fenced by the owner's epoch, before the request leaves: if the
  journal holds an answer for the same call (pipeline, node, item and call key), it is handed back,
  and the ledger row of the call that paid for it counts one more replay (no new row: nothing was
  paid). Otherwise the call's ledger row is written as ``in_flight``: from here a kill leaves a row
  that says "in flight at the crash, outcome unknown", neither lost nor counted twice.
* :meth:`JournalOps.journal_answer`, fenced, once the answer arrived and before the caller's code
  sees it: the answer is kept in the journal and the ledger row gets its tokens, latency and outcome.
* :meth:`JournalOps.complete_calls`, not fenced, for an attempt that failed or whose answer a
  superseded worker may not keep: the ledger states what was paid whoever owns the pipeline now.

Both fenced writes commit without waiting for the database's log flush (``commit_without_flush``, selected
with the fence):
a killed worker loses neither, and only a crash of the database server itself could lose the last of
them (the next synchronous commit, e.g. the item's checkpoint, makes them durable). Two flushed commits
per request cost more than the 2 % of a 200 ms call the journal may add.

Entries are pruned by a trigger when their pipeline completes or is canceled (migration 0014);
:meth:`JournalOps.prune_call_journal` removes those of pipelines that ended before it existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from sqlalchemy import FromClause, and_, bindparam, delete, func, select, update

from recovery_ext._errors import NotFound
from recovery_ext._store.database import chunks, retried
from recovery_ext._store.ledger import IN_FLIGHT, call_row
from recovery_ext._store.models import Ownership, ProviderCall
from recovery_ext._store.pipelines import PipelineOps
from recovery_ext._store.node_transitions import lost
from recovery_ext._store.schema import call_journal, pipelines, provider_calls
from recovery_ext._store.statuses import PipelineStatus

pc = provider_calls.c
jc = call_journal.c

ENDED = (PipelineStatus.COMPLETED, PipelineStatus.CANCELED)
_COMPLETION = ("model", "tokens_in", "tokens_out", "latency_seconds", "outcome", "cost", "note")


@dataclass(frozen=True)
class JournalHit:
    """A journaled answer (its JSON text) and the ledger row of the call that paid for it."""

    answer: str
    call: ProviderCall


class JournalOps(PipelineOps):
    def _fence_and_find(self, conn, own: Ownership, node_name: str | None, item_key: str, call_key: str | None):
        """The fence (lock the pipeline row against reclaim, check ``own``'s epoch), the commit without a log
        flush and the journal's look-up in one statement: a journaled call's writes are round trips."""
        p = pipelines.c
        columns = [p.epoch, p.owner, p.status, self.dialect.commit_without_flush().label("no_flush")]
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

    @retried
    def journal_begin(self, own: Ownership, call: ProviderCall, *, call_key: str | None) -> JournalHit | None:
        """Before a request leaves: the journaled answer of ``call_key`` if there is one (its ledger row counts
        a replay), else ``call`` written to the ledger as in flight. Fenced: a superseded worker raises
        :class:`OwnershipLost` here and sends nothing."""
        with self.write() as conn:
            found = self._fence_and_find(conn, own, call.node_name, call.item_key or "", call_key)
            if call_key is not None and found.call_id is not None:
                row = conn.execute(update(provider_calls).where(pc.id == found.call_id)
                                   .values(replays=pc.replays + 1).returning(*provider_calls.c)).first()
                if row is not None:
                    return JournalHit(found.answer, _call_of(row))
            self.write_calls(conn, [call], reached=False)
        return None

    @retried
    def journal_answer(self, own: Ownership, call: ProviderCall, *, call_key: str | None, answer: str | None) -> None:
        """The answer arrived: keep it under ``call_key`` (when it has one and could be encoded) and complete the
        call's ledger row, in one transaction fenced by ``own``'s epoch."""
        with self.write() as conn:
            self._fence_and_find(conn, own, call.node_name, "", None)
            if call_key is not None and answer is not None:
                stmt = self.dialect.insert(call_journal).values(
                    pipeline_id=own.pipeline_id, node_name=call.node_name, item_key=call.item_key or "",
                    call_key=call_key, call_id=call.id, epoch=own.epoch, answer=answer,
                    answered_at=self.dialect.now())
                conn.execute(stmt.on_conflict_do_update(  # fresh=True: the new answer replaces the old
                    index_elements=[jc.pipeline_id, jc.node_name, jc.item_key, jc.call_key],
                    set_={"call_id": stmt.excluded.call_id, "epoch": stmt.excluded.epoch,
                          "answer": stmt.excluded.answer, "answered_at": stmt.excluded.answered_at}))
            self._complete(conn, [call])

    @retried
    def complete_calls(self, calls: Sequence[ProviderCall]) -> None:
        """What became of calls written in flight (failed, or answered to a worker that may no longer keep the
        answer), whoever owns their pipeline now. A row already completed is left as it is."""
        if calls:
            with self.write() as conn:
                self._complete(conn, calls)

    def _complete(self, conn, calls: Sequence[ProviderCall]) -> None:
        stmt = (update(provider_calls).where(pc.id == bindparam("b_id"), pc.outcome == IN_FLIGHT)
                .values({name: bindparam(f"b_{name}") for name in _COMPLETION}))
        rows = [call_row(call) for call in calls]
        for part in chunks(rows, 500):
            conn.execute(stmt, [{"b_id": r["id"], **{f"b_{n}": r[n] for n in _COMPLETION}} for r in part])

    @retried
    def prune_call_journal(self, pipeline_id: int | None = None) -> int:
        """Delete the journal entries of ``pipeline_id`` (whatever its status), or of every pipeline that
        completed or was canceled; returns how many went. The ledger rows stay."""
        query = delete(call_journal)
        if pipeline_id is not None:
            query = query.where(jc.pipeline_id == pipeline_id)
        else:
            query = query.where(jc.pipeline_id.in_(select(pipelines.c.id).where(pipelines.c.status.in_(ENDED))))
        with self.write() as conn:
            return conn.execute(query).rowcount or 0

    @retried
    def call_journal_size(self, pipeline_id: int | None = None) -> tuple[int, int]:
        """How many entries the journal holds (of one pipeline) and the characters of their answers."""
        query = select(func.count(), func.coalesce(func.sum(func.length(jc.answer)), 0))
        if pipeline_id is not None:
            query = query.where(jc.pipeline_id == pipeline_id)
        with self.read() as conn:
            entries, chars = conn.execute(query).one()
        return int(entries), int(chars)


_CALL_FIELDS = {f.name for f in fields(ProviderCall) if f.init and not f.kw_only}


def _call_of(row) -> ProviderCall:
    return ProviderCall(**{k: v for k, v in row._mapping.items() if k in _CALL_FIELDS})
