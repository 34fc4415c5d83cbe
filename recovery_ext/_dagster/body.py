"""A recoverable node's body: the signature its decorator advertises to Dagster, what the decorator declares
(:class:`NodeDefinition`, :class:`RecoveryOptions`), one run of it (:class:`NodeRun`) and the call itself
(:func:`call_body`, which runs an ``async def`` body to its end).

A recoverable body is ``body(ctx, <inputs>, config: MyConfig, res: MyResource) -> T``: its first
parameter is the recovery context, the others are exactly what a plain ``@op``/``@asset`` body
takes. Dagster infers ins, the ``config`` class, resources and the output type from the compute
function's signature, so the compute function the decorators hand to Dagster advertises the
body's own parameters (annotations resolved in the body's module) behind Dagster's ``context``.

The classifier and a Dagster ``RetryPolicy`` compose here too: a permanent error is always
``Failure(allow_retries=False)``; a transient one retries as many times, and with the delay, the
policy says (:func:`resource_for_policy`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import typing
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dagster import ConfigurableResource, Failure, In, Output, ResourceDefinition, RetryPolicy

from recovery_ext._dagster.compat import advertise_signature
from recovery_ext._dagster.resources import RecoveryResource
from recovery_ext._liveness.heartbeat import HeartbeatSettings
from recovery_ext._store.interfaces import OpStore

Parameter = inspect.Parameter


@dataclass(frozen=True)
class BodySignature:
    """The body's parameters after the recovery context, with their annotations resolved."""

    name: str
    params: tuple[Parameter, ...]
    return_annotation: Any

    @classmethod
    def of(cls, body: Callable[..., Any]) -> BodySignature:
        params = list(inspect.signature(body).parameters.values())
        if not params or params[0].kind not in (Parameter.POSITIONAL_ONLY, Parameter.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{body.__name__}: a recoverable body takes the recovery context as its first parameter")
        try:
            hints = typing.get_type_hints(body)
        except NameError as exc:
            raise TypeError(f"{body.__name__}: cannot resolve an annotation ({exc}); "
                            "import it at module level") from exc
        resolved = tuple(
            p.replace(kind=Parameter.POSITIONAL_OR_KEYWORD if p.kind == Parameter.POSITIONAL_ONLY else p.kind,
                      annotation=hints.get(p.name, Parameter.empty))
            for p in params[1:]
        )
        return cls(body.__name__, resolved, hints.get("return", inspect.Signature.empty))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def restricted_to(self, inputs: Mapping[str, Any] | None) -> BodySignature:
        """With explicit ``ins``, the body's other non-config, non-resource parameters are not inputs
        (they keep their defaults)."""
        if inputs is None:
            return self
        kept = tuple(p for p in self.params if p.name in inputs or p.name == "config" or _is_resource(p.annotation))
        return BodySignature(self.name, kept, self.return_annotation)

    def plain_inputs(self) -> dict[str, In]:
        """Untyped ``In()`` for every parameter without an annotation (what ``@recoverable_op`` always did)."""
        return {p.name: In() for p in self.params if p.annotation is Parameter.empty and p.name != "config"}

    def compute_signature(self, context_annotation: Any = Parameter.empty) -> inspect.Signature:
        """``(context, *params) -> return``: what Dagster reads to infer config, resources, ins and out."""
        context = Parameter("context", Parameter.POSITIONAL_OR_KEYWORD, annotation=context_annotation)
        return inspect.Signature([context, *self.params], return_annotation=self.return_annotation)

    def attach(self, compute: Callable[..., Any], body: Callable[..., Any], name: str, *,
               context_annotation: Any = Parameter.empty, resource_key: str | None = None,
               typed_output: bool = True) -> Callable[..., Any]:
        """Give ``compute`` the body's Dagster-facing signature; ``resource_key`` adds the recovery
        resource as a typed parameter (so it mixes with the body's own typed resources)."""
        signature = self.compute_signature(context_annotation)
        params = list(signature.parameters.values())
        if resource_key is not None and resource_key not in self.names:
            params.append(Parameter(resource_key, Parameter.KEYWORD_ONLY, annotation=RecoveryResource))
        compute.__name__ = name
        compute.__doc__ = body.__doc__
        return advertise_signature(compute, signature.replace(
            parameters=params, return_annotation=signature.return_annotation if typed_output else Parameter.empty))


def _is_resource(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, (ConfigurableResource, ResourceDefinition))


def resource_for_policy(resource: RecoveryResource, policy: RetryPolicy | None) -> RecoveryResource:
    """The recovery settings a node uses under ``policy``: transient errors retry ``policy.max_retries``
    times, starting at ``policy.delay``; without a policy, the resource's own retry settings."""
    if policy is None:
        return resource
    update: dict[str, Any] = {"max_retries": policy.max_retries}
    if policy.delay is not None:
        update["retry_initial_delay"] = float(policy.delay)
        update["retry_max_delay"] = max(resource.retry_max_delay, float(policy.delay))
    return resource.model_copy(update=update)


class OutputMetadata:
    """A context that keeps the output metadata a node records, so the decorator attaches it to every
    output itself (a multi-output op or multi_asset needs one call per output name)."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.collected: dict[str, Any] = {}

    def add_output_metadata(self, metadata: Mapping[str, Any], output_name: str | None = None,
                            mapping_key: str | None = None) -> None:
        self.collected.update(metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def recordable(value: Any) -> Any:
    """What a recoverable *op* records for resumes to replay: the value inside an ``Output``."""
    return value.value if isinstance(value, Output) else value


@dataclass(frozen=True)
class RecoveryOptions:
    """How a recoverable op or asset reaches its recovery resource, and the liveness and retries it asks for."""

    resource_key: str = "recovery"
    retry_policy: RetryPolicy | None = None
    heartbeat: HeartbeatSettings | None = None  # None: the resource's settings


@dataclass(frozen=True)
class NodeDefinition:
    """A node as its decorator declared it: its name, its body and what to do when it had already finished."""

    name: str
    body: Callable[..., Any]
    heartbeat: HeartbeatSettings | None = None  # None: the resource's settings
    optional: bool = False  # degrades instead of failing the pipeline
    on_skip: Callable[[Any], Any] | None = None  # what a finished node returns (default: its recorded output)


@dataclass(frozen=True)
class NodeRun:
    """One execution of a node in this step: what every stage after finding the pipeline needs."""

    context: Any  # Dagster's op or asset execution context
    store: OpStore
    resource: RecoveryResource
    settings: HeartbeatSettings  # the node's, else the resource's
    node: NodeDefinition

    @property
    def name(self) -> str:
        return self.node.name


def call_body(body: Callable[..., Any], ctx: Any, inputs: dict[str, Any]) -> Any:
    """``body(ctx, **inputs)``; an ``async def`` body's coroutine is run to its end here, in the step's thread,
    so everything around it (the node's claim, heartbeats, its completion) is the same as for a sync body."""
    value = body(ctx, **inputs)
    if inspect.iscoroutine(value):
        return run_coroutine(value)
    if inspect.isasyncgen(value):
        raise Failure(description=f"{getattr(body, '__name__', 'the body')} is an async generator: a recoverable "
                                  "body is `def` or `async def` and returns its value (yield is for sync bodies)",
                      allow_retries=False)
    return value


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on an event loop of its own; where this thread already runs a loop (an async caller of
    ``execute_in_process``), on a thread of its own, with this context."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # run outside the except: an error of the body (an interrupt) is not chained to the look
        return asyncio.run(coro)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(1, thread_name_prefix="rx-async-body") as pool:
        return pool.submit(context.run, asyncio.run, coro).result()
