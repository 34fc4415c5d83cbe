"""Dagster-native signatures for recoverable ops and assets.

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

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster import ConfigurableResource, In, Output, ResourceDefinition, RetryPolicy

from recovery_ext._dagster.compat import advertise_signature
from recovery_ext._dagster.resources import RecoveryResource

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
