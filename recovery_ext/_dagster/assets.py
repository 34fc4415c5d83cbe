"""``@recoverable_asset`` and ``@recoverable_multi_asset``: software-defined assets whose body
gets the recovery context of a recoverable op (items and checkpoints, fenced transactions,
progress, the classifier's retries, escalation and outage pauses).

An asset is a node of its run's pipeline, named after its op; a partitioned run (one per
partition of a backfill) is its own pipeline, so checkpoints and pipeline state are kept per
partition key (or per partition range for a single-run backfill), and per asset within the run.

The asset materializes normally: its value goes through its IO manager, and its materialization
carries the recovery metadata (``items_done``, ``items_resumed``, ``items_degraded``,
``attempts``, ``recovery``: the run it completed in). Unlike an op, an asset's value is not
recorded in the application tables (the IO manager already stores it), so it need not be JSON.
A finished asset is not run again by a later run of the same pipeline: the run worker leaves its
step out of the plan (``replay.py``) and downstream steps load its stored value. Only a plan with
dynamic outputs (not split) runs its step again: it then re-emits the value its IO manager stored
for that asset and partition (``MaterializeResult`` assets emit an empty result), marked
``recovery: skipped: completed in run ...``, without recomputing it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from dagster import (AssetExecutionContext, AssetKey, AssetsDefinition, MaterializeResult, Output, RetryPolicy, asset,
                     multi_asset)

from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._dagster.context import NodeContext
from recovery_ext._dagster.body import (BodySignature, NodeDefinition, OutputMetadata, RecoveryOptions, call_body,
                                       resource_for_policy)
from recovery_ext._dagster.recoverable import run_node
from recovery_ext._dagster.tags import TAG_NODE, TAG_OPTIONAL

# a body annotated like this materializes without a value for the IO manager to store
_NO_VALUE = (MaterializeResult, type(None))


class _Events(list[Any]):
    """What a generator body yielded (drained inside the node, so its items are checkpointed first)."""


def _op_tags(op_tags: Mapping[str, Any] | None) -> dict[str, Any]:
    return {**(op_tags or {}), TAG_NODE: "true", TAG_OPTIONAL: "false"}


def _partition(context: AssetExecutionContext) -> str | None:
    return context.partition_key if context.has_partition_key else None


def _stored(context: AssetExecutionContext, key: AssetKey, stores_value: bool) -> Any:
    """What a finished asset re-emits: the value its IO manager stored, or an empty result."""
    if not stores_value:
        return MaterializeResult(asset_key=key)
    return context.load_asset_value(key, partition_key=_partition(context))


def _execute(context: AssetExecutionContext, body: Callable[..., Any], signature: BodySignature,
             options: RecoveryOptions, kwargs: dict[str, Any],
             on_skip: Callable[[Any], Any]) -> tuple[Any, dict[str, Any]]:
    """Run the body as a recoverable node: (its result, or ``on_skip``'s if it had finished; the recovery metadata)."""
    resource = resource_for_policy(getattr(context.resources, options.resource_key), options.retry_policy)
    if options.resource_key not in signature.names:
        kwargs.pop(options.resource_key, None)
    returned: list[Any] = []

    def unrecorded_body(ctx: NodeContext, **inputs: Any) -> None:
        result = call_body(body, ctx, inputs)
        returned.append(_Events(result) if inspect.isgenerator(result) else result)  # its events, inside the node

    collecting = OutputMetadata(context)
    node = NodeDefinition(context.op_def.name, unrecorded_body, heartbeat=options.heartbeat, on_skip=on_skip)
    skipped = run_node(collecting, resource, kwargs, node)
    return (returned[0] if returned else skipped), collecting.collected


def recoverable_asset(
    fn: Callable[..., Any] | None = None,
    *,
    resource_key: str = "recovery",
    heartbeat: HeartbeatSettings | None = None,
    retry_policy: RetryPolicy | None = None,
    op_tags: Mapping[str, Any] | None = None,
    **asset_kwargs: Any,
) -> Any:  # an AssetsDefinition, or (without ``fn``) the decorator that makes one
    """``@asset`` whose body ``fn(ctx: NodeContext, *upstream, config=..., resources...)`` is a recoverable node.

    Every ``@asset`` argument passes through (``partitions_def``, ``ins``, ``deps``, ``pool``,
    ``group_name``, ``metadata``, ...). The body may return a value (stored by the IO manager),
    ``Output`` or ``MaterializeResult`` with metadata; the recovery metadata is added to it.
    The job needs ``executor_def=with_recovery(...)`` (or ``Definitions(executor=with_recovery(...))``
    for the implicit asset job that backfills use) and a ``recovery`` resource.
    """

    options = RecoveryOptions(resource_key, retry_policy, heartbeat)

    def decorate(body: Callable[..., Any]) -> Any:
        signature = BodySignature.of(body)
        stores_value = signature.return_annotation not in _NO_VALUE

        def compute(context: AssetExecutionContext, **kwargs: Any) -> Any:
            result, metadata = _execute(
                context, body, signature, options, kwargs,
                on_skip=lambda node: _stored(context, context.asset_key, stores_value))
            if isinstance(result, _Events):  # a generator body: its one event
                (result,) = result
            context.add_output_metadata(metadata)
            return result

        signature.attach(compute, body, asset_kwargs.pop("name", None) or body.__name__,
                         context_annotation=AssetExecutionContext, resource_key=resource_key)
        return asset(compute, op_tags=_op_tags(op_tags), retry_policy=retry_policy, **asset_kwargs)

    return decorate(fn) if fn is not None else decorate


def recoverable_multi_asset(
    *,
    resource_key: str = "recovery",
    heartbeat: HeartbeatSettings | None = None,
    retry_policy: RetryPolicy | None = None,
    op_tags: Mapping[str, Any] | None = None,
    name: str | None = None,
    **multi_asset_kwargs: Any,
) -> Callable[[Callable[..., Any]], AssetsDefinition]:
    """``@multi_asset`` (``outs=`` or ``specs=``, ``can_subset=`` ...) whose body is one recoverable node.

    The body returns one value, ``Output`` or ``MaterializeResult`` per selected asset (a tuple, in
    the order of ``outs``/``specs``), or yields them; each materialization gets the recovery metadata.
    """

    options = RecoveryOptions(resource_key, retry_policy, heartbeat)

    def decorate(body: Callable[..., Any]) -> Any:
        signature = BodySignature.of(body)
        stores_value = "specs" not in multi_asset_kwargs and signature.return_annotation not in _NO_VALUE

        def compute(context: AssetExecutionContext, **kwargs: Any) -> Any:
            selected = context.selected_output_names  # a set: the order is that of outs/specs
            names = [o.name for o in context.op_def.output_defs if o.name in selected]
            keys = {n: context.asset_key_for_output(n) for n in names}
            result, metadata = _execute(
                context, body, signature, options, kwargs,
                on_skip=lambda node: tuple(_stored(context, keys[n], stores_value) for n in names))
            for output_name in names:
                context.add_output_metadata(metadata, output_name=output_name)
            results = result if isinstance(result, (tuple, _Events)) else (result,)
            # not strict: Dagster itself names an output the body did not return
            for output_name, value in zip(names, results, strict=False):
                if isinstance(value, (Output, MaterializeResult)):
                    yield value
                else:
                    yield Output(value, output_name=output_name)

        signature.attach(compute, body, name or body.__name__, context_annotation=AssetExecutionContext,
                         resource_key=resource_key, typed_output=False)
        return multi_asset(name=name or body.__name__, op_tags=_op_tags(op_tags), retry_policy=retry_policy,
                           **multi_asset_kwargs)(compute)

    return decorate
