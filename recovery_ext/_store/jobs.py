"""Asynchronous provider jobs in the store: each submission is written, with its idempotency token and its
ledger row, before the job is submitted; the provider's job id as soon as it is known; and what became
of it. Every write is fenced by the owner's epoch, so a superseded worker neither submits nor records.

The submission's ledger row (operation ``batch``: ``provider_jobs`` in the endpoint) is written in flight
with the token, completed as ``submitted`` (or ``resubmitted`` for a later attempt over the items an
earlier job left unfinished) once the id is known, and marked as reaching a checkpoint when the job's
results are collected: the ledger shows every submission, and each resubmission as one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import insert, select, update
from typing import Any

from recovery_ext._store.database import Component, Database, Fence, retried
from recovery_ext._store.ledger import IN_FLIGHT, LedgerWrites
from recovery_ext._store.models import Ownership, ProviderCall, ProviderJobRow
from recovery_ext._store.schema import provider_calls, provider_jobs
from recovery_ext._store.statuses import JobStatus

j = provider_jobs.c
pc = provider_calls.c

SUBMITTING, SUBMITTED, COLLECTED = JobStatus.SUBMITTING, JobStatus.SUBMITTED, JobStatus.COLLECTED
LIVE = (SUBMITTING, SUBMITTED)


def _row(r: Any) -> ProviderJobRow:
    parts = json.loads(r.parts) if r.parts else {}
    return ProviderJobRow(r.token, r.provider, r.job_id, r.status, tuple(json.loads(r.items)), r.attempt, r.call_id,
                          r.created_at, accepted=dict(parts.get("accepted", {})), sending=parts.get("sending"))


class ProviderJobs(Component):
    """Asynchronous provider jobs (a part of ``store.pipelines``). Its collaborators: ``fence`` (the owner's lock
    and epoch check) and ``ledger`` (each submission's ledger row)."""

    def __init__(self, db: Database, *, fence: Fence, ledger: LedgerWrites) -> None:
        super().__init__(db)
        self.fence = fence
        self.ledger = ledger

    @retried
    def provider_jobs(self, pipeline_id: int, node_name: str | None = None) -> list[ProviderJobRow]:
        """The jobs of a pipeline (of one node), oldest first."""
        query = select(provider_jobs).where(j.pipeline_id == pipeline_id).order_by(j.created_at, j.attempt)
        if node_name is not None:
            query = query.where(j.node_name == node_name)
        with self.read() as conn:
            return [_row(r) for r in conn.execute(query)]

    @retried
    def job_live(self, own: Ownership, node_name: str, provider: str) -> ProviderJobRow | None:
        """The node's job not finished yet (submitting, or submitted and not collected), if any: a resume
        re-attaches to it."""
        with self.write() as conn:
            self.fence.check(conn, own)
            found = conn.execute(select(provider_jobs).where(
                j.pipeline_id == own.pipeline_id, j.node_name == node_name, j.provider == provider,
                j.status.in_(LIVE)).order_by(j.attempt.desc())).first()
        return None if found is None else _row(found)

    @retried
    def job_submitting(self, own: Ownership, node_name: str, *, token: str, provider: str, items: Sequence[str],
                       attempt: int, call: ProviderCall) -> None:
        """Before the submission: its token, its items and its ledger row (in flight), fenced."""
        with self.write() as conn:
            self.fence.check(conn, own)
            self.ledger.write_calls(conn, [call], reached=False)
            conn.execute(insert(provider_jobs).values(
                pipeline_id=own.pipeline_id, node_name=node_name, token=token, provider=provider, job_id=None,
                status=SUBMITTING, items=json.dumps(list(items)), attempt=attempt, epoch=own.epoch, call_id=call.id,
                created_at=self.dialect.now(), updated_at=self.dialect.now()))

    @retried
    def job_submitted(self, own: Ownership, node_name: str, token: str, job_id: str, *, outcome: str) -> None:
        """The provider's job id, as soon as it is known; the submission's ledger row says ``outcome``."""
        with self.write() as conn:
            self.fence.check(conn, own)
            call_id = conn.execute(update(provider_jobs).where(
                j.pipeline_id == own.pipeline_id, j.node_name == node_name, j.token == token)
                .values(job_id=job_id, status=SUBMITTED, updated_at=self.dialect.now()).returning(j.call_id)).scalar()
            conn.execute(update(provider_calls).where(pc.id == call_id, pc.outcome == IN_FLIGHT)
                         .values(outcome=outcome))

    @retried
    def job_part(self, own: Ownership, node_name: str, token: str, item: str, part: str | None) -> None:
        """A job submitted part by part, while it is submitting: ``item``'s submission is about to go out
        (``part`` None), or the provider accepted it as ``part``. Written before the next part goes out, so a
        resume knows which parts exist and which one may be on its way; fenced, so a superseded worker's
        submission stops at its next part."""
        with self.write() as conn:
            self.fence.check(conn, own)
            parts = self._parts(conn, own, node_name, token)
            if part is None:
                parts["sending"] = item
            else:
                parts["accepted"][item] = part
                parts["sending"] = None
            self._set_parts(conn, own, node_name, token, parts)

    @retried
    def job_part_lost(self, own: Ownership, node_name: str, token: str, item: str, call: ProviderCall) -> None:
        """A resume found ``item``'s submission on its way and no part for it: its ledger row (``call``: it may
        have been paid) and the mark cleared, in one transaction, so a second resume does not ledger it again."""
        with self.write() as conn:
            self.fence.check(conn, own)
            parts = self._parts(conn, own, node_name, token)
            if parts["sending"] != item:
                return  # already ledgered
            self.ledger.write_calls(conn, [call], reached=False)
            parts["sending"] = None
            self._set_parts(conn, own, node_name, token, parts)

    @staticmethod
    def _parts(conn: Any, own: Ownership, node_name: str, token: str) -> dict[str, Any]:
        found = conn.execute(select(j.parts).where(j.pipeline_id == own.pipeline_id, j.node_name == node_name,
                                                   j.token == token, j.status == SUBMITTING)).first()
        if found is None:
            raise LookupError(f"no job submitting under token {token} for {node_name!r}")
        parts = json.loads(found.parts) if found.parts else {}
        return {"accepted": dict(parts.get("accepted", {})), "sending": parts.get("sending")}

    def _set_parts(self, conn: Any, own: Ownership, node_name: str, token: str, parts: dict[str, Any]) -> None:
        conn.execute(update(provider_jobs).where(j.pipeline_id == own.pipeline_id, j.node_name == node_name,
                                                 j.token == token)
                     .values(parts=json.dumps(parts, separators=(",", ":")), updated_at=self.dialect.now()))

    @retried
    def job_finished(self, own: Ownership, node_name: str, token: str, status: str,
                     calls: Sequence[ProviderCall] = ()) -> None:
        """What became of the job (collected, expired, cancelled, failed); its results reached their items'
        checkpoints, so the submission's ledger row did too. ``calls``: the ledger rows of what its results held
        for no item (paid, never kept), written in the same transaction, so once."""
        with self.write() as conn:
            self.fence.check(conn, own)
            self.ledger.write_calls(conn, calls, reached=False)
            call_id = conn.execute(update(provider_jobs).where(
                j.pipeline_id == own.pipeline_id, j.node_name == node_name, j.token == token)
                .values(status=status, updated_at=self.dialect.now()).returning(j.call_id)).scalar()
            conn.execute(update(provider_calls).where(pc.id == call_id).values(reached_checkpoint=True))
