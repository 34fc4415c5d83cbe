"""Pipelines and nodes: creation, fenced writes and heartbeats (item checkpoints: checkpoints.py).

Every write a worker makes goes through :meth:`~recovery_ext._store.database.Fence.check`
(``PipelineCore.fence`` here), which locks the pipeline row (the single writer lock on SQLite) and checks
the worker's epoch in the same transaction. A reclaim bumps the epoch under ``FOR UPDATE``, so the two are
serialized: a superseded worker's write changes nothing and raises
:class:`~recovery_ext._errors.OwnershipLost`.

Lock strength on PostgreSQL: a transaction that will UPDATE the pipeline row (node
transitions) takes ``FOR NO KEY UPDATE`` first, the lock its UPDATE needs anyway; one
that only writes other tables (checkpoints, user writes) takes ``FOR KEY SHARE``, which
blocks a reclaim's ``FOR UPDATE`` but not the run heartbeat's UPDATE, so a long user
transaction or a slow checkpoint never delays the heartbeat of its own pipeline. No
transaction ever upgrades its lock, so sibling nodes cannot deadlock on the pipeline
row; they queue. Every transaction locks the pipeline row before any node or item row,
so they always lock in the same order. Deadlocks elsewhere are retried by the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import cached_property
from typing import Any

from sqlalchemy import Connection, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from recovery_ext._conventions import placeholder_owner
from recovery_ext._processes import this_process, watcher_of_this_process
from recovery_ext._store.database import Component, Database, Fence, chunks, is_retry, retried
from recovery_ext._store.node_transitions import NODE_TRANSITIONS, NodeTransitions, illegal, transitions_for
from recovery_ext._store.ledger import LedgerWrites
from recovery_ext._settings import check_deployment
from recovery_ext._errors import IllegalTransition, NotFound, OwnershipLost, StoreError, StoreUnavailable
from recovery_ext._store.models import (ErrorInfo, FencedTransaction, ItemCheckpoint, Node, NodeSpec, Ownership,
                                        Pipeline, PipelineLimits)
from recovery_ext._classify.redaction import redact, redact_config
from recovery_ext._store.schema import nodes, pipelines, waiting_shown
from recovery_ext._store.schema import transitions as transition_rows
from recovery_ext._store.statuses import FINISHED_NODE_STATUSES, NodeStatus, PipelineStatus

__all__ = ["NODE_TRANSITIONS", "ItemCheckpoint", "PipelineCore", "PipelineNodes"]  # ItemCheckpoint: its old home


# What a pipeline's new owner (a reclaim's resume, a re-execution's or run retry's take-over) starts
# without: the dead run's outage pause, its reason and the outage clock. The new run's outage budget
# starts at its own first failure.
NEW_OWNER_RESETS: dict[str, None] = {"waiting_until": None, "waiting_since": None, "waiting_reason": None}

STALL_PUSH_SLACK = 0.1


def stall_push(stall_timeout: float) -> tuple[float, float]:
    """When progress moves a node's stall deadline, and to where: ``(at_least, pushed_to)``, seconds from now on
    the database clock. The deadline moves only when less than ``at_least`` (the stall timeout) is left, and
    then to ``pushed_to``, a tenth more.

    So after any progress the deadline is at least a stall timeout away: a node becomes due between one stall
    timeout and 1.1 of it after its last progress, never sooner. And a node whose items finish many a second
    rewrites its row about ten times per stall timeout, not once per item: the deadline is indexed
    (``rx_nodes_stalled``), so each push is a new version of the row and of its index entries, and a reclaim
    waits behind the row's lock. Every push (an item checkpoint on either database, ``ctx.progress()``) goes
    by this rule; a node's start sets the deadline from its own stall timeout, whatever was pushed before.
    A deadline that is not a finite time (a corrupt row) is never earlier than anything, so no push replaces
    it: the orphan sensor's corrupt-row check fails that pipeline instead."""
    return stall_timeout, stall_timeout * (1 + STALL_PUSH_SLACK)


class PipelineCore(Component):
    """The fence and the node and pipeline moves every component that writes for an owner shares: the store
    builds one and hands it to each component that needs it, so all of them fence the same way.

    Its collaborators: ``fence`` (the owner's lock and epoch check) and ``ledger`` (the ledger's writes, which
    the node steps make in a node's completing transaction)."""

    def __init__(self, db: Database, *, ledger: LedgerWrites) -> None:
        super().__init__(db)
        self.ledger = ledger
        self.fence = Fence()

    @cached_property
    def transitions(self) -> NodeTransitions:
        """How this store's nodes start and complete: chosen on first use (not when the store is built: a bench
        switches the dialect's flags in between), once, from its dialect."""
        return transitions_for(self)

    def refresh_pipeline(self, conn: Connection, own: Ownership, heartbeat_timeout: float | None,
                         **values: Any) -> None:
        if heartbeat_timeout is not None:
            values["heartbeat_at"] = self.dialect.now()
            values["heartbeat_deadline"] = self.dialect.now_plus(heartbeat_timeout)
        conn.execute(
            update(pipelines)
            .where(pipelines.c.id == own.pipeline_id, pipelines.c.epoch == own.epoch)
            .values(updated_at=self.dialect.now(), **values)
        )

    @retried
    def check_ownership(self, own: Ownership) -> None:
        with self.write() as conn:
            self.fence.check(conn, own)

    def move_node(self, conn: Connection, own: Ownership, name: str, target: NodeStatus, event: str,
                  extra: dict[str, Any] | None = None, **values: Any) -> Node:
        sources = NODE_TRANSITIONS[target]
        before = conn.execute(
            select(nodes.c.id, nodes.c.status, nodes.c.run_id)
            .where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == name)
        ).first()
        if before is None:
            raise NotFound(f"pipeline {own.pipeline_id} has no node {name!r}")
        if is_retry() and before.status == target and before.run_id == own.owner:
            # The first attempt committed before its connection dropped: the move is done.
            row = conn.execute(select(nodes).where(nodes.c.id == before.id)).one()
            return Node.from_row(row._mapping)
        if before.status not in sources:
            raise illegal(own.pipeline_id, name, before.status, target)
        row = conn.execute(
            update(nodes)
            .where(nodes.c.id == before.id, nodes.c.status == before.status)
            .values(status=target, updated_at=self.dialect.now(), **values)
            .returning(*nodes.c)
        ).one()
        data = {"epoch": own.epoch, "owner": own.owner, **(extra or {})}
        if "error" in values and values["error"]:
            data["error"] = values["error"]
        self.record_transitions(
            conn,
            [{"entity_type": "node", "entity_id": before.id, "pipeline_id": own.pipeline_id,
              "from_status": before.status, "to_status": target, "event": event, "data": data}],
        )
        return Node.from_row(row._mapping)

    def start_node_in(self, conn: Connection, own: Ownership, name: str, heartbeat_timeout: float,
                      stall_timeout: float | None) -> Node:
        node = self.move_node(
            conn, own, name, NodeStatus.RUNNING, "started",
            attempts=nodes.c.attempts + 1,
            run_id=own.owner,
            started_at=self.dialect.now(),
            completed_at=None,
            heartbeat_at=self.dialect.now(),
            heartbeat_deadline=self.dialect.now_plus(heartbeat_timeout),
            stall_deadline=self.dialect.now_plus(stall_timeout) if stall_timeout else None,
            # who runs it and who can vouch for it (the process that started it), for the orphan scan
            process=this_process(), watcher=watcher_of_this_process(), vouched_until=None, died_at=None,
        )
        self.refresh_pipeline(conn, own, heartbeat_timeout, current_node=name)
        return node

    def complete_pipeline_if_done(self, conn: Connection, own: Ownership) -> bool:
        unfinished = conn.scalar(
            select(func.count()).where(
                nodes.c.pipeline_id == own.pipeline_id, nodes.c.status.not_in(FINISHED_NODE_STATUSES)
            )
        )
        if unfinished:
            return False
        self.finish_pipeline(conn, own, PipelineStatus.COMPLETED)
        return True

    def finish_pipeline(self, conn: Connection, own: Ownership, status: str, *, error: str | None = None,
                        reason: str | None = None) -> None:
        conn.execute(
            update(pipelines)
            .where(pipelines.c.id == own.pipeline_id, pipelines.c.epoch == own.epoch,
                   pipelines.c.status == PipelineStatus.RUNNING)
            .values(status=status, completed_at=self.dialect.now(), updated_at=self.dialect.now(),
                    current_node=None, heartbeat_deadline=None, error=error, gave_up_reason=reason,
                    waiting_until=None, waiting_since=None, waiting_reason=None)
        )
        self.record_transitions(
            conn,
            [{"entity_type": "pipeline", "entity_id": own.pipeline_id, "pipeline_id": own.pipeline_id,
              "from_status": PipelineStatus.RUNNING, "to_status": status, "event": status,
              "data": {"epoch": own.epoch, "owner": own.owner, **({"error": error} if error else {})}}],
        )
        if status == PipelineStatus.FAILED:
            self.record_events(conn, [{"kind": "pipeline_failed", "pipeline_id": own.pipeline_id,
                                       "payload": {"error": error, "owner": own.owner}}])

    def cancel_owned_by(self, conn: Connection, run_ids: Sequence[str],
                        reason: str = "the owning run was canceled") -> list[int]:
        canceled: list[int] = []
        for part in chunks(list(run_ids)):
            rows = conn.execute(
                select(pipelines.c.id, pipelines.c.epoch, pipelines.c.owner)
                .where(pipelines.c.status == PipelineStatus.RUNNING, pipelines.c.owner.in_(list(part)))
                .order_by(pipelines.c.id).with_for_update(skip_locked=True)
            ).all()
            for r in rows:
                own = Ownership(r.id, r.epoch, r.owner)
                self.fail_running_nodes_of(conn, own, "pipeline canceled")
                self.finish_pipeline(conn, own, PipelineStatus.CANCELED, reason=reason)
                self.record_events(conn, [{"kind": "pipeline_canceled", "pipeline_id": r.id,
                                           "payload": {"owner": r.owner, "reason": reason}}])
                canceled.append(r.id)
        return canceled

    def fail_running_nodes_of(self, conn: Connection, own: Ownership, error: str) -> None:
        rows = conn.execute(
            update(nodes).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.status == NodeStatus.RUNNING)
            .values(status=NodeStatus.FAILED, error=error, stall_deadline=None, updated_at=self.dialect.now())
            .returning(nodes.c.id)
        ).all()
        self.record_transitions(conn, [
            {"entity_type": "node", "entity_id": r.id, "pipeline_id": own.pipeline_id,
             "from_status": NodeStatus.RUNNING,
             "to_status": NodeStatus.FAILED, "event": error.replace(" ", "_"),
             "data": {"epoch": own.epoch}} for r in rows
        ])


class PipelineNodes(Component):
    """Pipelines and their nodes: creation and attachment, reads, the fenced transaction, node transitions and
    progress (a part of ``store.pipelines``).

    Its collaborators: ``rows`` (the pipeline and node moves every component shares, and ``rows.transitions``:
    how this store's nodes start and complete) and ``fence`` (the owner's lock and epoch check).
    """

    def __init__(self, db: Database, *, rows: PipelineCore, fence: Fence) -> None:
        super().__init__(db)
        self.rows = rows
        self.fence = fence

    # -- creation and attachment ------------------------------------------------------------

    @retried
    def create_pipeline(
        self,
        job_name: str,
        node_specs: Sequence[NodeSpec | str],
        *,
        owner: str,
        params: Any = None,
        origin_run_id: str | None = None,
        limits: PipelineLimits = PipelineLimits(),
        deployment: str = "default",
    ) -> Ownership:
        """Create a running pipeline owned by ``owner`` (epoch 1) with all its nodes pending, held to ``limits``.

        With ``origin_run_id`` this is idempotent: every op of the same Dagster run gets
        the same pipeline, whichever process gets there first.
        """
        check_deployment("deployment", deployment)
        specs = [NodeSpec(s) if isinstance(s, str) else s for s in node_specs]
        if not specs:
            raise StoreError("a pipeline needs at least one node")
        if len({s.name for s in specs}) != len(specs):
            raise StoreError(f"duplicate node names in {[s.name for s in specs]}")
        now = self.dialect.now()
        values = dict(
            job_name=job_name,
            origin_run_id=origin_run_id,
            # stored for operators and resumes: secrets in run config (an api_key, a URL's password) masked
            params=redact_config(params) if params is not None else {},
            status=PipelineStatus.RUNNING,
            owner=owner,
            epoch=1,
            heartbeat_at=now,
            heartbeat_deadline=self.dialect.now_plus(limits.heartbeat_timeout),
            deadline=self.dialect.now_plus(limits.deadline_seconds) if limits.deadline_seconds is not None else None,
            resume_count=0,
            max_resumes=limits.max_resumes,
            deployment=deployment,
            created_at=now,
            started_at=now,
            updated_at=now,
        )
        with self.write() as conn:
            if origin_run_id is not None:
                existing = conn.execute(
                    select(pipelines.c.id, pipelines.c.epoch, pipelines.c.owner).where(
                        pipelines.c.origin_run_id == origin_run_id
                    )
                ).first()
                if existing is not None:
                    return self._ownership_or_raise(existing, owner)
            try:
                with conn.begin_nested():
                    pipeline_id = conn.execute(
                        insert(pipelines).values(**values).returning(pipelines.c.id)).scalar_one()
            except IntegrityError:
                existing = conn.execute(
                    select(pipelines.c.id, pipelines.c.epoch, pipelines.c.owner).where(
                        pipelines.c.origin_run_id == origin_run_id
                    )
                ).one()
                return self._ownership_or_raise(existing, owner)
            conn.execute(
                insert(nodes).values(updated_at=now),
                [
                    {"pipeline_id": pipeline_id, "name": s.name, "position": i, "status": NodeStatus.PENDING,
                     "optional": s.optional, "attempts": 0}
                    for i, s in enumerate(specs)
                ],
            )
            self.record_transitions(
                conn,
                [{"entity_type": "pipeline", "entity_id": pipeline_id, "pipeline_id": pipeline_id,
                  "from_status": None, "to_status": PipelineStatus.RUNNING, "event": "created",
                  "data": {"owner": owner}}],
            )
        return Ownership(pipeline_id, 1, owner)

    @staticmethod
    def _ownership_or_raise(row: Any, owner: str) -> Ownership:
        if row.owner != owner:
            raise OwnershipLost(owner=row.owner, pipeline_id=row.id)
        return Ownership(row.id, row.epoch, owner)

    @retried
    def attach(self, pipeline_id: int, run_id: str, *, resume_number: int,
               heartbeat_timeout: float = 90.0) -> Ownership:
        """A resume run takes the ownership its reclaim reserved for resume ``resume_number``."""
        placeholder = placeholder_owner(pipeline_id, resume_number)
        with self.write() as conn:
            row = conn.execute(
                update(pipelines)
                .where(
                    pipelines.c.id == pipeline_id,
                    pipelines.c.status == PipelineStatus.RUNNING,
                    pipelines.c.resume_count == resume_number,
                    (pipelines.c.owner.in_([placeholder, run_id])) | pipelines.c.owner.is_(None),
                )
                .values(
                    owner=run_id,
                    heartbeat_at=self.dialect.now(),
                    heartbeat_deadline=self.dialect.now_plus(heartbeat_timeout),
                    updated_at=self.dialect.now(),
                )
                .returning(pipelines.c.epoch)
            ).first()
            if row is not None:
                return Ownership(pipeline_id, row.epoch, run_id)
        current = self.get_pipeline(pipeline_id)
        raise OwnershipLost(owner=current.owner or "(none)", pipeline_id=pipeline_id, status=current.status)

    # -- reads -------------------------------------------------------------------------------

    @retried
    def get_pipeline(self, pipeline_id: int) -> Pipeline:
        with self.read_statement() as conn:
            row = conn.execute(select(pipelines, waiting_shown(self.dialect.now()).label("waiting_shown"))
                               .where(pipelines.c.id == pipeline_id)).first()
        if row is None:
            raise NotFound(f"no pipeline {pipeline_id}")
        return Pipeline.from_row(row._mapping)

    @retried
    def find_pipeline(self, origin_run_id: str) -> Pipeline | None:
        with self.read_statement() as conn:
            row = conn.execute(select(pipelines, waiting_shown(self.dialect.now()).label("waiting_shown"))
                               .where(pipelines.c.origin_run_id == origin_run_id)).first()
        return None if row is None else Pipeline.from_row(row._mapping)

    @retried
    def last_reclaim(self, pipeline_id: int) -> dict[str, Any] | None:
        """What the latest reclaim of a pipeline recorded (cause, heartbeat age, previous owner), if any: a
        resume run words its take-over with it."""
        with self.read_statement() as conn:
            data = conn.execute(
                select(transition_rows.c.data).where(transition_rows.c.pipeline_id == pipeline_id,
                                                     transition_rows.c.entity_type == "pipeline",
                                                     transition_rows.c.event == "reclaimed")
                .order_by(transition_rows.c.id.desc()).limit(1)).scalar()
        return data if isinstance(data, dict) else None

    @retried
    def list_nodes(self, pipeline_id: int) -> list[Node]:
        with self.read_statement() as conn:
            rows = conn.execute(select(nodes).where(nodes.c.pipeline_id == pipeline_id).order_by(nodes.c.position))
            return [Node.from_row(r._mapping) for r in rows]

    @retried
    def get_node(self, pipeline_id: int, name: str) -> Node:
        with self.read_statement() as conn:
            row = conn.execute(select(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == name)).first()
        if row is None:
            raise NotFound(f"pipeline {pipeline_id} has no node {name!r}")
        return Node.from_row(row._mapping)

    # -- fencing -----------------------------------------------------------------------------

    @contextmanager
    def fenced(self, own: Ownership) -> Iterator[FencedTransaction]:
        """A write transaction that belongs to ``own``: fenced by its epoch before the caller's first statement.

        Opening it (connect, lock, epoch check) is retried on transient errors within the
        retry budget; the caller's statements are not (a context manager cannot re-run its
        body), so their transient errors propagate and fail the node retryably. When the
        server ended the session under them (a worker frozen inside the transaction comes
        back to that), a new session asks the fence first: a superseded owner is told so.
        """
        for attempt in self._retrying("fenced transaction"):
            with attempt:
                stack = ExitStack()
                try:
                    conn = stack.enter_context(self.write())
                    self.fence.check(conn, own)
                except BaseException as exc:
                    stack.__exit__(type(exc), exc, exc.__traceback__)
                    raise
        try:
            with stack:
                tx = FencedTransaction(self, conn, own)
                try:
                    yield tx
                finally:
                    tx.close()
        except StoreUnavailable as exc:
            if exc.session_lost:
                self._raise_if_superseded(own, exc)
            raise

    def _raise_if_superseded(self, own: Ownership, lost: StoreUnavailable) -> None:
        """``OwnershipLost`` (from ``lost``) when a new session's fence says ``own`` was superseded; nothing when
        it holds, or when the database cannot say (the caller then raises ``lost`` itself)."""
        try:
            self.rows.check_ownership(own)
        except OwnershipLost as superseded:
            raise superseded from lost
        except StoreError:
            pass

    @retried
    def write_fenced(self, own: Ownership, work: Callable[[FencedTransaction], Any]) -> Any:
        """Run ``work(tx)`` in a fenced transaction; the whole transaction is retried on transient errors."""
        with self.fenced(own) as tx:
            return work(tx)

    # -- node transitions --------------------------------------------------------------------

    @retried
    def start_node(
        self, own: Ownership, name: str, *, heartbeat_timeout: float = 90.0, stall_timeout: float | None = None
    ) -> Node:
        """pending/failed -> running under ``own``; counts an attempt and starts the node's heartbeat."""
        with self.write() as conn:
            self.fence.check(conn, own, for_update=True)
            return self.rows.start_node_in(conn, own, name, heartbeat_timeout, stall_timeout)

    @retried
    def begin_node(self, run_id: str, name: str, *, heartbeat_timeout: float = 90.0,
                   stall_timeout: float | None = None) -> tuple[Ownership, Node, bool] | None:
        """What a node does first, in ONE transaction: find the running pipeline ``run_id`` owns,
        then either return its node as recorded (already finished: a resume skips it) or start it.

        Returns ``(ownership, node, started)``, or None when ``run_id`` owns no running
        pipeline (the caller asks why). The pipeline row is locked ``FOR NO KEY UPDATE``
        first, as :meth:`start_node` does, so nothing can take it over in between.
        """
        return self.rows.transitions.begin(run_id, name, heartbeat_timeout, stall_timeout)

    @retried
    def complete_node(self, own: Ownership, name: str, output: Any = None, *, heartbeat_timeout: float | None = None,
                      calls: Sequence[Any] = ()) -> bool:
        """running -> completed with its output. Returns whether that completed the pipeline.

        Refused (:class:`UnfinishedItems`) while fewer of the node's items are finished (completed
        or degraded) than it asked for through ``ctx.items``: nothing is lost by completing early.
        ``calls``: the provider calls (outside any item) whose answers the output keeps, marked
        reached_checkpoint in the ledger in the same transaction.
        """
        return self.rows.transitions.complete(own, name, output, heartbeat_timeout, calls)

    @retried
    def degrade_node(self, own: Ownership, name: str, error: ErrorInfo, *,
                     heartbeat_timeout: float | None = None) -> bool:
        """An optional node gave up: the pipeline goes on without it. Returns whether the pipeline completed."""
        with self.write() as conn:
            if self.fence.check(conn, own, for_update=True, finished_ok=True) != PipelineStatus.RUNNING:
                return True
            optional = conn.scalar(
                select(nodes.c.optional).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == name)
            )
            if not optional:
                raise IllegalTransition(
                    f"node {name!r} of pipeline {own.pipeline_id} is not optional; it cannot degrade")
            self.rows.move_node(
                conn, own, name, NodeStatus.DEGRADED, NodeStatus.DEGRADED, completed_at=self.dialect.now(),
                stall_deadline=None,
                **_error_values(error),
            )
            self.rows.refresh_pipeline(conn, own, heartbeat_timeout)
            return self.rows.complete_pipeline_if_done(conn, own)

    @retried
    def fail_node(self, own: Ownership, name: str, error: ErrorInfo, *, permanent: bool,
                  data: dict[str, Any] | None = None) -> None:
        """running -> failed. A permanent failure also fails the pipeline."""
        with self.write() as conn:
            if self.fence.check(conn, own, for_update=True, finished_ok=True) != PipelineStatus.RUNNING:
                return
            extra = {"node": name, "category": error.category, **(data or {})}
            self.rows.move_node(conn, own, name, NodeStatus.FAILED, NodeStatus.FAILED, extra=extra,
                                stall_deadline=None, **_error_values(error))
            if permanent:
                self.rows.finish_pipeline(conn, own, PipelineStatus.FAILED, error=redact(error.message))
            else:
                self.rows.refresh_pipeline(conn, own, None)

    # -- liveness ----------------------------------------------------------------------------

    @retried
    def report_progress(self, own: Ownership, name: str, *, stall_timeout: float) -> None:
        """The node moved forward: its stall deadline is at least ``stall_timeout`` away again
        (:func:`stall_push`)."""
        at_least, pushed_to = stall_push(stall_timeout)
        with self.write() as conn:
            self.fence.check(conn, own)
            conn.execute(
                update(nodes)
                .where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == name,
                       nodes.c.status == NodeStatus.RUNNING,
                       or_(nodes.c.stall_deadline.is_(None), nodes.c.stall_deadline < self.dialect.now_plus(at_least)))
                .values(stall_deadline=self.dialect.now_plus(pushed_to))
            )


def _error_values(error: ErrorInfo) -> dict[str, Any]:
    return {"error": redact(error.message)[:4000], "error_category": error.category,
            "error_status_code": error.status_code}

