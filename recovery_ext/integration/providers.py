"""A node's guarded provider calls: the outage guard bound to the node's pipeline (issue 10)."""

from __future__ import annotations

from collections.abc import Callable

from ..outage import ProviderGuard, StorePause
from ..retry import RetryPolicy
from .recoverable import NodeContext


def provider_guard(ctx: NodeContext, endpoint: str, policy: RetryPolicy, *,
                   sleep: Callable[[float], None] | None = None) -> ProviderGuard:
    """Calls to ``endpoint`` from this node: the shared breaker, Retry-After, pauses shown on the pipeline.

    A pause sleeps in the node while its watchdog keeps heartbeating; losing ownership wakes it at once.
    """
    watchdog = ctx.watchdog
    return ProviderGuard(
        endpoint, policy=policy, settings=ctx.resource.outage_settings(), store=ctx.store,
        pause=StorePause(ctx.store, ctx.ownership, ctx.node_name),
        who=f"{ctx.ownership.owner}/{ctx.pipeline_id}/{ctx.node_name}",
        shutdown=watchdog.superseded if watchdog is not None else None, sleep=sleep,
        log=ctx.log.warning,
    )
