"""How a node starts, checks its items and completes: one strategy per store, chosen once from its dialect.

Two implementations of the same steps, raising the same exceptions with the same messages:

* :class:`ServerFunctionTransitions` (PostgreSQL): ``rx_begin_node`` / ``rx_complete_node`` (migration
  0008) and statements prepared once per connection (``hot_path``), one autocommit round trip per step;
* :class:`PortableTransitions` (any database): the store's statements one by one in a transaction.

The store calls only :class:`NodeTransitions`; nothing else asks which one it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sqlalchemy import Connection, Float, bindparam, func, select, type_coerce, update
from sqlalchemy.sql.elements import ColumnElement

from recovery_ext._errors import IllegalTransition, NotFound, OwnershipLost, UnfinishedItems
from recovery_ext._processes import this_process, watcher_of_this_process
from recovery_ext._store import hot_path
from recovery_ext._store.database import Fence, is_retry, lost
from recovery_ext._store.dialects import Dialect
from recovery_ext._store.ledger import LedgerWrites
from recovery_ext._store.models import Node, Ownership, ProviderCall
from recovery_ext._store.schema import ITEM_STATUSES, circuit_breakers, node_items, nodes, pipelines
from recovery_ext._store.statuses import NodeStatus, PipelineStatus

# Legal node transitions: target -> allowed sources.
NODE_TRANSITIONS: dict[NodeStatus, tuple[NodeStatus, ...]] = {
    NodeStatus.RUNNING: (NodeStatus.PENDING, NodeStatus.FAILED),
    NodeStatus.COMPLETED: (NodeStatus.RUNNING,),
    NodeStatus.FAILED: (NodeStatus.RUNNING,),
    NodeStatus.DEGRADED: (NodeStatus.RUNNING, NodeStatus.FAILED, NodeStatus.PENDING),
    NodeStatus.PENDING: (NodeStatus.RUNNING, NodeStatus.FAILED),
    # the run succeeded without executing it (e.g. a branch not taken)
    NodeStatus.SKIPPED: (NodeStatus.PENDING, NodeStatus.FAILED),
}

Begun = tuple[Ownership, Node, bool]


class TransitionHost(Protocol):
    """What the strategies use of the store (the store's PipelineCore): its transactions, its fenced single steps,
    and its collaborators ``fence`` and ``ledger``."""

    dialect: Dialect

    def write(self) -> AbstractContextManager[Connection]: ...
    def read_statement(self) -> AbstractContextManager[Connection]: ...
    def driver_autocommit(self) -> AbstractContextManager[Any]: ...
    def driver_of(self, conn: Connection) -> AbstractContextManager[Any]: ...
    def check_ownership(self, own: Ownership) -> None: ...
    @property
    def fence(self) -> Fence: ...
    @property
    def ledger(self) -> LedgerWrites: ...
    def start_node_in(self, conn: Connection, own: Ownership, name: str, heartbeat_timeout: float,
                      stall_timeout: float | None) -> Node: ...
    def move_node(self, conn: Connection, own: Ownership, name: str, target: NodeStatus, event: str,
                  extra: dict[str, Any] | None = None, **values: Any) -> Node: ...
    def refresh_pipeline(self, conn: Connection, own: Ownership, heartbeat_timeout: float | None,
                         **values: Any) -> None: ...
    def complete_pipeline_if_done(self, conn: Connection, own: Ownership) -> bool: ...


class NodeTransitions:
    """A node's steps; see the store's ``begin_node``, ``complete_node``, ``start_items`` and
    ``completed_items`` for what each means."""

    def __init__(self, db: TransitionHost) -> None:
        self.db = db

    def begin(self, run_id: str, name: str, heartbeat_timeout: float, stall_timeout: float | None) -> Begun | None:
        raise NotImplementedError

    def complete(self, own: Ownership, name: str, output: Any, heartbeat_timeout: float | None,
                 calls: Sequence[ProviderCall]) -> bool:
        raise NotImplementedError

    def start_items(self, own: Ownership, node_name: str, total: int) -> dict[str, str]:
        raise NotImplementedError

    def completed_items(self, pipeline_id: int, node_name: str) -> dict[str, Any]:
        raise NotImplementedError

    def breaker_state(self, endpoint: str) -> Any:
        """The endpoint's breaker (state, consecutive_failures, open_left, probe_left), or None: read
        before every provider call, so it is part of a step's cost."""
        raise NotImplementedError


class PortableTransitions(NodeTransitions):
    def __init__(self, db: TransitionHost) -> None:
        super().__init__(db)
        # built once per store: building it cost more than running it
        now, cb = db.dialect.now(), circuit_breakers.c

        def seconds(start: Any, end: Any) -> ColumnElement[float]:
            return type_coerce(db.dialect.seconds_between(start, end), Float)

        self._breaker_statement = (
            select(cb.state, cb.consecutive_failures, seconds(now, cb.open_until).label("open_left"),
                   seconds(now, cb.probe_deadline).label("probe_left"))
            .where(cb.endpoint == bindparam("endpoint")))

    def begin(self, run_id: str, name: str, heartbeat_timeout: float, stall_timeout: float | None) -> Begun | None:
        db = self.db
        with db.write() as conn:
            row = conn.execute(
                select(pipelines.c.id, pipelines.c.epoch)
                .where(pipelines.c.owner == run_id, pipelines.c.status == PipelineStatus.RUNNING)
                .order_by(pipelines.c.id).limit(1).with_for_update(key_share=True)
            ).first()
            if row is None:
                return None
            own = Ownership(row.id, row.epoch, run_id)
            current = conn.execute(select(nodes).where(nodes.c.pipeline_id == own.pipeline_id,
                                                       nodes.c.name == name)).first()
            if current is None:
                raise NotFound(f"pipeline {own.pipeline_id} has no node {name!r}")
            recorded = Node.from_row(current._mapping)
            if recorded.finished:
                return own, recorded, False
            node = db.start_node_in(conn, own, name, heartbeat_timeout, stall_timeout)
        return own, node, True

    def complete(self, own: Ownership, name: str, output: Any, heartbeat_timeout: float | None,
                 calls: Sequence[ProviderCall]) -> bool:
        db = self.db
        with db.write() as conn:
            if db.fence.check(conn, own, for_update=True, finished_ok=True) != PipelineStatus.RUNNING:
                return True
            refuse_unfinished_items(conn, own, name)
            if calls:
                db.ledger.write_calls(conn, calls, reached=True)
            db.move_node(
                conn, own, name, NodeStatus.COMPLETED, NodeStatus.COMPLETED,
                output=output, completed_at=db.dialect.now(), error=None, error_category=None,
                error_status_code=None, stall_deadline=None, run_id=own.owner,
            )
            db.refresh_pipeline(conn, own, heartbeat_timeout)
            return db.complete_pipeline_if_done(conn, own)

    def start_items(self, own: Ownership, node_name: str, total: int) -> dict[str, str]:
        with self.db.write() as conn:
            self.db.fence.check(conn, own)
            conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == node_name)
                         .values(items_total=total))
            rows = conn.execute(select(node_items.c.item_key, node_items.c.status).where(
                node_items.c.pipeline_id == own.pipeline_id, node_items.c.node_name == node_name))
            return {r.item_key: r.status for r in rows}

    def completed_items(self, pipeline_id: int, node_name: str) -> dict[str, Any]:
        with self.db.read_statement() as conn:
            rows = conn.execute(select(node_items.c.item_key, node_items.c.result).where(
                node_items.c.pipeline_id == pipeline_id, node_items.c.node_name == node_name))
            return {r.item_key: r.result for r in rows}

    def breaker_state(self, endpoint: str) -> Any:
        with self.db.read_statement() as conn:
            return conn.execute(self._breaker_statement, {"endpoint": endpoint}).first()



class ServerFunctionTransitions(NodeTransitions):
    def begin(self, run_id: str, name: str, heartbeat_timeout: float, stall_timeout: float | None) -> Begun | None:
        with self.db.driver_autocommit() as raw:
            row = hot_path.begin_node(
                raw, run_id=run_id, name=name, sources=list(NODE_TRANSITIONS[NodeStatus.RUNNING]),
                heartbeat_timeout=float(heartbeat_timeout), stall_timeout=float(stall_timeout or 0.0), retry=is_retry(),
                process=this_process(), watcher=watcher_of_this_process())
        if row.outcome == "no_pipeline":
            return None
        own = Ownership(row.pipeline, row.pipeline_epoch, run_id)
        if row.outcome == "no_node":
            raise NotFound(f"pipeline {own.pipeline_id} has no node {name!r}")
        if row.outcome == "illegal":
            raise illegal(own.pipeline_id, name, row.from_status, NodeStatus.RUNNING)
        return own, Node.from_row(row._asdict()), row.outcome == "started"

    def complete(self, own: Ownership, name: str, output: Any, heartbeat_timeout: float | None,
                 calls: Sequence[ProviderCall]) -> bool:
        if not calls:
            with self.db.driver_autocommit() as raw:
                return self._complete(raw, own, name, output, heartbeat_timeout)
        with self.db.write() as conn:  # the ledger's writes, then the completion, then one COMMIT
            self.db.ledger.write_calls(conn, calls, reached=True)
            with self.db.driver_of(conn) as raw:
                # a refusal raises, so this transaction rolls back
                return self._complete(raw, own, name, output, heartbeat_timeout)

    @staticmethod
    def _complete(raw: Any, own: Ownership, name: str, output: Any, heartbeat_timeout: float | None) -> bool:
        row = hot_path.complete_node(
            raw, pipeline_id=own.pipeline_id, epoch=own.epoch, owner=own.owner, name=name, output=output,
            sources=list(NODE_TRANSITIONS[NodeStatus.COMPLETED]), item_statuses=list(ITEM_STATUSES),
            heartbeat_timeout=None if heartbeat_timeout is None else float(heartbeat_timeout), retry=is_retry())
        if row.outcome == "no_pipeline":
            raise NotFound(f"no pipeline {own.pipeline_id}")
        if row.outcome == "lost":
            raise lost(own, row.owner, row.epoch, row.status)
        if row.outcome == "no_node":
            raise NotFound(f"pipeline {own.pipeline_id} has no node {name!r}")
        if row.outcome == "unfinished":
            raise unfinished(own.pipeline_id, name, row.unfinished, row.total)
        if row.outcome == "illegal":
            raise illegal(own.pipeline_id, name, row.status, NodeStatus.COMPLETED)
        return row.outcome in ("pipeline_completed", "pipeline_finished")

    def start_items(self, own: Ownership, node_name: str, total: int) -> dict[str, str]:
        # the fence, the update and the read as CTEs of one autocommit statement
        with self.db.driver_autocommit() as raw:
            rows = hot_path.start_items(raw, pipeline_id=own.pipeline_id, epoch=own.epoch, node=node_name,
                                        total=total)
        if not rows[0].fenced:
            self.db.check_ownership(own)  # raises OwnershipLost (or NotFound) with who owns it now
            raise OwnershipLost(owner="(changed meanwhile)", pipeline_id=own.pipeline_id)
        return {r.item_key: r.status for r in rows[1:]}

    def completed_items(self, pipeline_id: int, node_name: str) -> dict[str, Any]:
        with self.db.driver_autocommit() as raw:
            return hot_path.completed_items(raw, pipeline_id=pipeline_id, node=node_name)

    def breaker_state(self, endpoint: str) -> Any:
        with self.db.driver_autocommit() as raw:
            return hot_path.breaker_state(raw, endpoint)


def transitions_for(db: TransitionHost) -> NodeTransitions:
    """The one choice: the server's functions where its migrations made them, else the portable statements."""
    return (ServerFunctionTransitions if db.dialect.node_functions else PortableTransitions)(db)


def refuse_unfinished_items(conn: Connection, own: Ownership, name: str) -> None:
    total = conn.scalar(select(nodes.c.items_total).where(nodes.c.pipeline_id == own.pipeline_id,
                                                          nodes.c.name == name))
    if not total:
        return
    finished = conn.scalar(select(func.count()).select_from(node_items).where(
        node_items.c.pipeline_id == own.pipeline_id, node_items.c.node_name == name,
        node_items.c.status.in_(ITEM_STATUSES))) or 0
    if finished < total:
        raise unfinished(own.pipeline_id, name, total - finished, total)


def illegal(pipeline_id: int, name: str, before: str, target: NodeStatus) -> IllegalTransition:
    return IllegalTransition(f"node {name!r} of pipeline {pipeline_id}: {before} -> {target} is not allowed "
                             f"(allowed from: {', '.join(NODE_TRANSITIONS[target])})")


def unfinished(pipeline_id: int, name: str, unfinished: int, total: int) -> UnfinishedItems:
    return UnfinishedItems(
        f"node {name!r} of pipeline {pipeline_id} cannot complete: {unfinished} of its {total} items are "
        "unfinished (each must be completed or degraded); nothing was written",
        pipeline_id=pipeline_id, node=name, unfinished=unfinished)
