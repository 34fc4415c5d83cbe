"""The call journal and the ledger's started calls: what makes a provider answer paid for once.

A journaled call goes through three writes, each one transaction:

* :meth:`CallJournal.journal_begin`, fenced by the owner's epoch, before the request leaves: if the
  journal holds an answer for the same call (pipeline, node, item and call key), it is handed back,
  and the ledger row of the call that paid for it counts one more replay (no new row: nothing was
  paid). Otherwise the call's ledger row is written as ``in_flight``: from here a kill leaves a row
  that says "in flight at the crash, outcome unknown", neither lost nor counted twice.
* :meth:`CallJournal.journal_answer`, fenced, once the answer arrived and before the caller's code
  sees it: the answer is kept in the journal and the ledger row gets its tokens, latency and outcome.
* :meth:`CallJournal.complete_calls`, not fenced, for an attempt that failed or whose answer a
  superseded worker may not keep: the ledger states what was paid whoever owns the pipeline now.

The two fenced writes are each one round trip on PostgreSQL (server functions, migration 0018) and the
portable statements of one transaction elsewhere: see journal_writes.py.

Both fenced writes commit without waiting for the database's log flush (``commit_without_flush``, selected
with the fence; ``synchronous_commit`` off in the server functions): a killed worker loses neither, and only a
crash of the database server itself could lose the last of them (the next synchronous commit, e.g. the item's
checkpoint, makes them durable). Two flushed commits per request cost more than the 2 % of a 200 ms call the
journal may add.

Entries are pruned by a trigger when their pipeline completes or is canceled (migration 0014);
:meth:`CallJournal.prune_call_journal` removes those of pipelines that ended before it existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from sqlalchemy import Connection, bindparam, delete, select, update

from recovery_ext._store.database import Component, Database, chunks, retried
from recovery_ext._store.journal_writes import JournalWrites, journal_writes_for
from recovery_ext._store.ledger import IN_FLIGHT, LedgerWrites, call_row
from recovery_ext._store.models import JournalHit, JournalWrite, Ownership, ProviderCall
from recovery_ext._store.schema import call_journal, pipelines, provider_calls
from recovery_ext._store.statuses import PipelineStatus

__all__ = ["CallJournal", "JournalHit"]

pc = provider_calls.c
jc = call_journal.c

ENDED = (PipelineStatus.COMPLETED, PipelineStatus.CANCELED)
_COMPLETION = ("model", "tokens_in", "tokens_out", "latency_seconds", "outcome", "cost", "note")


class CallJournal(Component):
    """The call journal and the ledger rows of journaled calls. Its collaborator: ``ledger`` (the ledger's
    writes in the caller's transaction)."""

    def __init__(self, db: Database, *, ledger: LedgerWrites) -> None:
        super().__init__(db)
        self.ledger = ledger

    @cached_property
    def _journal_writes(self) -> JournalWrites:
        """How this store's journaled calls write: chosen once, from its dialect (journal_writes.py)."""
        return journal_writes_for(self)

    @retried
    def journal_begin(self, own: Ownership, call: ProviderCall, *, call_key: str | None) -> JournalHit | None:
        """Before a request leaves: the journaled answer of ``call_key`` if there is one (its ledger row counts
        a replay), else ``call`` written to the ledger as in flight. Fenced: a superseded worker raises
        :class:`OwnershipLost` here and sends nothing."""
        return self._journal_writes.begin(own, call, call_key)

    @retried
    def journal_answer(self, own: Ownership, call: ProviderCall, *, call_key: str | None, answer: str | None) -> None:
        """The answer arrived: keep it under ``call_key`` (when it has one and could be encoded) and complete the
        call's ledger row, in one transaction fenced by ``own``'s epoch."""
        self._journal_writes.answer(own, call, call_key, answer)

    @retried
    def journal_writes(self, own: Ownership, writes: Sequence[JournalWrite]) -> list[JournalHit | None | Exception]:
        """Several calls' begins and answers (the items of a node in flight together) in one transaction, each
        fenced by ``own``'s epoch; one result per write: a begin's hit, None, or the refusal of that write
        (OwnershipLost). See ``JournalWrites.batch``."""
        return self._journal_writes.batch(own, writes) if writes else []

    @retried
    def complete_calls(self, calls: Sequence[ProviderCall]) -> None:
        """What became of calls written in flight (failed, or answered to a worker that may no longer keep the
        answer), whoever owns their pipeline now. A row already completed is left as it is."""
        if calls:
            with self.write() as conn:
                self._complete_calls_in(conn, calls)

    def _complete_calls_in(self, conn: Connection, calls: Sequence[ProviderCall]) -> None:
        """:meth:`complete_calls` in the caller's transaction."""
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
    def record_provider_calls(self, calls: Sequence[ProviderCall]) -> None:
        """Write calls that have not reached a checkpoint (yet); a call already written is left as it is."""
        if not calls:
            return
        with self.write() as conn:
            self.ledger.write_calls(conn, calls, reached=False)

