"""``@recoverable_op``: a Dagster op that is a node of a crash-recoverable pipeline.

Each call finds the pipeline its run owns (the run worker created, attached or took it
over at run start: ``with_recovery``), skips the node if it already completed (returning
the recorded output), claims the node under the pipeline's ownership epoch, heartbeats the
node while the body runs (batched with everything else this process keeps alive), maps errors
through the shared classifier, and completes the node with its output. Every write is fenced: a
superseded worker stops with "superseded by run <id>" and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from dagster import Failure, In, OpExecutionContext, Out, Output, RetryPolicy, RetryRequested, op

from recovery_ext._classify.classifier import ClassifiedError, classify, with_context
from recovery_ext._classify.retry import without_escalation
from recovery_ext._errors import (IllegalTransition, OwnershipLost, StopRequested, StoreUnavailable, UnfinishedItems,
                                  in_chain)
from recovery_ext._liveness.heartbeat import HeartbeatSettings, Lease, registry_for
from recovery_ext._store.models import Node, Ownership
from recovery_ext._classify.redaction import redact
from recovery_ext._dagster.executor import has_run_liveness, is_run_worker
from recovery_ext._liveness.heartbeat import dead_run_worker, watch_run_worker
from recovery_ext._providers.ledger import current_scope
from recovery_ext._dagster.providers import node_outage_pause
from recovery_ext._dagster.replay import skipped_metadata
from recovery_ext._dagster.run_state import RunStateReporter
from recovery_ext._dagster.context import Item, NodeContext, replayable_output  # noqa: F401 - Item is re-exported
from recovery_ext._dagster.errors import DATABASE_OUTAGE, error_info, failure_metadata, to_dagster
from recovery_ext._dagster.body import (BodySignature, NodeDefinition, NodeRun, call_body, recordable,
                                       resource_for_policy)
from recovery_ext._dagster.resources import RecoveryResource
from recovery_ext._dagster.tags import TAG_NODE, TAG_OPTIONAL, TAG_PIPELINE, TAG_RESUME_NUMBER, TAG_RESUMED_FROM  # noqa: F401
from recovery_ext._store.statuses import NodeStatus
from recovery_ext._store.interfaces import OpStore


def _owned(context: OpExecutionContext, store: OpStore, op_name: str) -> tuple[int, Ownership | None, str]:
    """The pipeline this op's run owns: (pipeline id, ownership or None, why not).

    The run worker created, attached or took over the pipeline at run start (``with_recovery``);
    a node only finds it. A run without that scope is refused loudly, never run without liveness.
    """
    run_id = context.run_id
    _require_run_liveness(context, op_name)
    own = store.pipelines.owned_by(run_id)
    if own is not None:
        return own.pipeline_id, own, ""
    pipeline_id = store.pipelines.formerly_owned_by(run_id)
    if pipeline_id is None:
        raise Failure(description=f"run {run_id} owns no pipeline: its run scope did not start",
                      allow_retries=False)
    current = store.pipelines.get_pipeline(pipeline_id)
    if current.owner == run_id:  # still this run's, but it ended (e.g. another node failed it for good)
        return pipeline_id, None, f"pipeline {pipeline_id} is already {current.status}"
    return pipeline_id, None, f"superseded by run {current.owner or f'(none; pipeline {current.status})'}"


def _require_run_liveness(context: OpExecutionContext, op_name: str) -> None:
    if not has_run_liveness(context.job_def.executor_def, context.run_id):
        raise Failure(
            description=f"{op_name} is a @recoverable_op, but job {context.job_def.name!r} does not keep its "
            "pipeline alive for the whole run: define it with @recoverable_job or "
            "executor_def=with_recovery(<executor>) (tests: recovery_ext.testing.execute_in_process)",
            allow_retries=False,
        )


def _consecutive_same(store: OpStore, pipeline_id: int, node: str, category: str, limit: int) -> int:
    count = 0
    for previous in store.reports.recent_failure_categories(pipeline_id, node, limit=limit):
        if previous != category:
            break
        count += 1
    return count


def recoverable_op(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    optional: bool = False,
    ins: Mapping[str, In] | None = None,
    out: Out | None = None,
    config_schema: Any = None,
    heartbeat: HeartbeatSettings | None = None,
    description: str | None = None,
    required_resource_keys: set[str] | None = None,
    resource_key: str = "recovery",
    tags: Mapping[str, str] | None = None,
    pool: str | None = None,
    retry_policy: RetryPolicy | None = None,
) -> Any:  # an OpDefinition, or (without ``fn``) the decorator that makes one
    """Turn ``fn(ctx: NodeContext, *inputs)`` into a Dagster op that is a recoverable pipeline node.

    Beside the recovery context the body takes what a plain ``@op`` body takes: inputs (typed by
    their annotations), ``config: MyConfig`` and typed resources; it may return ``Output`` with
    metadata. ``retry_policy`` sets how transient errors retry (permanent ones never do).
    ``optional=True`` nodes degrade instead of failing the pipeline (like a glossary
    steps); their output is untyped since a degraded node outputs None. Outputs must be
    JSON-serializable: a resume run replays the recorded value.
    """

    def decorate(body: Callable[..., Any]) -> Any:
        op_name = name or body.__name__
        signature = BodySignature.of(body).restricted_to(ins)
        op_ins = dict(ins) if ins is not None else signature.plain_inputs()
        op_tags = {**(tags or {}), TAG_NODE: "true", TAG_OPTIONAL: "true" if optional else "false"}

        def compute(context: OpExecutionContext, **kwargs: Any) -> Any:
            resource = resource_for_policy(getattr(context.resources, resource_key), retry_policy)
            if resource_key not in signature.names:
                kwargs.pop(resource_key, None)
            returned: list[Any] = []

            def recorded_body(ctx: NodeContext, **inputs: Any) -> Any:
                returned.append(call_body(body, ctx, inputs))
                return recordable(returned[0])

            output = run_node(context, resource, kwargs,
                              NodeDefinition(op_name, recorded_body, heartbeat=heartbeat, optional=optional))
            if returned and isinstance(returned[0], Output):  # keep the user's Output (metadata, name)
                first = returned[0]
                return Output(output, output_name=first.output_name, metadata=first.metadata,
                              data_version=first.data_version, tags=first.tags)
            return output

        legacy_keys = required_resource_keys is not None
        signature.attach(compute, body, op_name, resource_key=None if legacy_keys else resource_key,
                         typed_output=not optional)
        # the undecorated body (bench/ontology_overhead_bench.py runs it as a plain op); mypy has no function attributes
        compute.__rx_body__ = body  # type: ignore[attr-defined]
        return op(
            name=op_name, ins=op_ins, out=out, config_schema=config_schema,
            description=description or body.__doc__, tags=op_tags, retry_policy=retry_policy,
            required_resource_keys=({resource_key, *required_resource_keys} if required_resource_keys is not None
                                    else None), pool=pool,
        )(compute)

    return decorate(fn) if fn is not None else decorate


def run_node(context: Any, resource: RecoveryResource, inputs: dict[str, Any], node: NodeDefinition) -> Any:
    """One execution of a recoverable node (op or asset): skip it if it finished, else run its body."""
    try:
        return _compute(context, resource, inputs, node)
    except StoreUnavailable as exc:  # past the store's retry budget: never a raw database error
        return _outage(context, resource, node, exc)


def _compute(context: Any, resource: RecoveryResource, inputs: dict[str, Any], definition: NodeDefinition) -> Any:
    store = resource.get_store()
    op_name = definition.name
    if not is_run_worker(context.run_id) and (dead := dead_run_worker()) is not None:
        # Nothing started, nothing written: the orphan sensor's resume runs this node.
        raise Failure(description=f"{op_name} not started: its run worker (pid {dead}) died before this step "
                                  "process began; the pipeline resumes from its checkpoints", allow_retries=False)
    run = NodeRun(context, store, resource, definition.heartbeat or resource.heartbeat_settings(), definition)
    begun = _begin(context, store, run.settings, op_name)
    own: Ownership | None
    if begun is not None:  # the common case: one transaction found the pipeline, the node and started it
        own, node, started = begun
        pipeline_id = own.pipeline_id
    else:
        pipeline_id, own, owner = _owned(context, store, op_name)
        node, started = store.pipelines.get_node(pipeline_id, op_name), False
    if node is not None and node.finished:
        metadata = skipped_metadata(node, pipeline_id)
        context.log.info(f"{op_name} {metadata['recovery']}")
        context.add_output_metadata(metadata)
        return node.output if definition.on_skip is None else definition.on_skip(node)
    if own is None:
        raise Failure(description=f"{op_name} not run: {owner}",
                      metadata={"pipeline_id": pipeline_id}, allow_retries=False)
    return _run_node(run, own, inputs, node if started else None)


def _begin(context: OpExecutionContext, store: OpStore, settings: HeartbeatSettings,
           op_name: str) -> tuple[Ownership, Node, bool] | None:
    """``store.pipelines.begin_node`` for this run, after refusing a job without run-level liveness."""
    _require_run_liveness(context, op_name)
    try:
        return store.pipelines.begin_node(context.run_id, op_name, heartbeat_timeout=settings.timeout,
                                stall_timeout=settings.stall_timeout)
    except IllegalTransition as exc:
        raise Failure(description=str(exc), allow_retries=False) from exc


def _run_node(run: NodeRun, own: Ownership, inputs: dict[str, Any], node: Node | None = None) -> Any:
    context, store, settings, op_name = run.context, run.store, run.settings, run.name
    try:
        if node is None:  # not started by begin_node
            node = store.pipelines.start_node(own, op_name, heartbeat_timeout=settings.timeout,
                                    stall_timeout=settings.stall_timeout)
    except OwnershipLost as exc:
        raise Failure(description=f"superseded by run {exc.owner}", allow_retries=False) from exc
    except IllegalTransition as exc:
        raise Failure(description=str(exc), allow_retries=False) from exc
    # the node's own heartbeat: what the run worker cannot see (this step's process, its host, a stall)
    watchdog = registry_for(store).register(own, settings, node=op_name)
    # A step process apart from its run worker watches it, so it starts no provider call once it died.
    gone = None if is_run_worker(context.run_id) else watch_run_worker()
    ctx = NodeContext(context, store, own, op_name, settings, watchdog, run.resource, run_worker_gone=gone)
    scope = current_scope.set(ctx)
    try:
        return _run_body(run, own, inputs, node, ctx, watchdog)
    finally:
        current_scope.reset(scope)
        ctx.flush_ledger()  # calls no checkpoint took (failed, superseded, stopped): written before the step ends


def _stopped(ctx: NodeContext, watchdog: Lease, stop: BaseException, raised: BaseException) -> NoReturn:
    """The step's end when its body stopped on ``stop`` (ownership lost or a stop requested; ``raised`` is what
    the body raised, a client library's error around it, say): the run worker died, or another run took over."""
    if watchdog.lost is None and ctx.run_worker_gone is not None and ctx.run_worker_gone.is_set():
        # from None: the expected end of a step whose run worker died, one line, no chained traceback
        raise Failure(description="the run worker died; this step process stopped before its next provider "
                                  "call (the pipeline resumes from its checkpoints)", allow_retries=False) from None
    owner = getattr(watchdog.lost or stop, "owner", None)
    raise Failure(description=f"superseded by {f'run {owner}' if owner else 'another run'}; stopped without writing",
                  allow_retries=False) from raised


def _run_body(run: NodeRun, own: Ownership, inputs: dict[str, Any], node: Node, ctx: NodeContext,
              watchdog: Lease) -> Any:
    context, store, settings, op_name = run.context, run.store, run.settings, run.name
    if context.retry_number:  # a retry after an outage pause: running again, the outage clock keeps going
        store.providers.clear_waiting(own, node=op_name, keep_outage_clock=True, event="outage_retry")
        # the outage clock runs on until this try finishes an item (see end_outage_if_progressed); an ordinary
        # retry, with no outage under way, keeps nothing
        ctx.outage_clock_kept = store.providers.waiting_seconds(own.pipeline_id) is not None
        RunStateReporter(context, op_name).going_on(f"retry {context.retry_number} of {op_name} started")
    try:
        output = replayable_output(run.node.body(ctx, **inputs))
        ctx.flush()  # completions a batched items() loop still buffers (the body left the loop early)
        ctx.check_maps_awaited()  # after the flush: what the body finished is kept even when this fails it
        ctx.check()
    except (OwnershipLost, StopRequested) as exc:
        _stopped(ctx, watchdog, exc, exc)
    except (Failure, RetryRequested):
        raise
    except Exception as exc:  # noqa: BLE001 - every error goes through the shared classifier
        stopped = in_chain(exc, (OwnershipLost, StopRequested))
        if stopped is not None:  # a client library wrapped it (an SDK's connection error around the transport's)
            _stopped(ctx, watchdog, stopped, exc)
        return _handle_error(run, own, without_escalation(exc), ctx, node.attempts)
    finally:
        watchdog.release()
    node_calls = ctx._take_calls(None)
    try:
        if context.retry_number:
            store.providers.clear_waiting(own, node=op_name)
        store.pipelines.complete_node(own, op_name, output, heartbeat_timeout=settings.timeout, calls=node_calls)
    except OwnershipLost as exc:
        raise Failure(description=f"superseded by run {exc.owner}; result discarded", allow_retries=False) from exc
    except UnfinishedItems as exc:  # a body that returned before finishing its items: fails (or degrades)
        return _handle_error(run, own, exc, ctx, node.attempts)
    ctx.calls_written(node_calls)
    context.add_output_metadata({
        "recovery": f"completed in run {own.owner}", "skipped": False, "pipeline_id": own.pipeline_id,
        "epoch": own.epoch, "attempts": node.attempts, **ctx.item_counts(), **ledger_metadata(store, ctx),
        **ctx.metadata,
    })
    return output


def ledger_metadata(store: OpStore, ctx: NodeContext) -> dict[str, Any]:
    """Provider calls as output metadata, labelled by what they count: ``run_provider_calls``, the calls this
    run made (beside its ``items_done``), and ``node_provider_*``, the node's calls, tokens and cost across all its
    runs (spent, saved by resume, wasted); only for nodes that recorded calls or kept items from an earlier run
    (one read)."""
    if not ctx.calls_recorded and not ctx.items_resumed:
        return {}
    ctx.flush_ledger()
    this_run = {"run_provider_calls": ctx.calls_recorded}
    try:
        figures = store.reports.provider_costs(ctx.pipeline_id).nodes.get(ctx.pipeline_id, {}).get(ctx.node_name)
    except Exception as exc:  # noqa: BLE001 - a report never fails the node
        ctx.log.warning(f"provider ledger not read: {redact(exc)}")
        return this_run
    return this_run | ({} if figures is None else {f"node_provider_{key}": value
                                                    for key, value in figures.as_dict().items()})


def _store_outage(exc: BaseException) -> StoreUnavailable | None:
    found = in_chain(exc, StoreUnavailable)
    return found if isinstance(found, StoreUnavailable) else None


def _outage(context: Any, resource: RecoveryResource, node: NodeDefinition, exc: StoreUnavailable) -> Any:
    """The application database stayed unreachable past the store's retry budget.

    Reports it without touching the database: an optional node degrades (its output is
    None); a required node fails the run without marking anything permanent: its node row
    stays ``running``, so once the database is back the orphan sensor sees the dead run and
    resumes the pipeline (an in-run retry could not restart a node it could not mark failed).
    """
    message = f"the recovery database is unavailable (past the {resource.store_retry_budget():.0f} s retry budget)"
    op_name = node.name
    if node.optional:
        context.log.warning(f"optional node {op_name} degraded: {message}: {exc}")
        context.add_output_metadata({"recovery": "degraded (database unavailable)", "category": "database_transient"})
        return None
    raise Failure(description=f"{op_name}: {message}: {exc}; the pipeline resumes once the database is back",
                  metadata={"category": "database_transient", "retryable": True, **DATABASE_OUTAGE},
                  allow_retries=False) from None


def _handle_error(run: NodeRun, own: Ownership, exc: Exception, ctx: NodeContext, attempts: int) -> Any:
    context, store, resource, op_name = run.context, run.store, run.resource, run.name
    if (outage := _store_outage(exc)) is not None:  # reporting a database error must not need the database
        return _outage(context, resource, run.node, outage)
    model = getattr(exc, "model", None) if isinstance(exc, ClassifiedError) else None
    endpoint = getattr(exc, "endpoint", None) if isinstance(exc, ClassifiedError) else None
    err = with_context(exc, model=model, endpoint=endpoint)
    category = classify(err).category
    transient = err.retryable
    decision = to_dagster(err, retry_number=context.retry_number, max_retries=resource.max_retries,
                          wait=resource.retry_wait())
    repeated = _consecutive_same(store, own.pipeline_id, op_name, category, resource.same_error_limit) + 1
    if transient:
        # An outage this retried try outlived (it finished an item since) is over, whatever this failure leads to
        # (a pause, or an ordinary retry whose next try starts with no progress of its own): it starts anew.
        try:
            ctx.end_outage_if_progressed()
        except OwnershipLost as lost:
            raise Failure(description=f"superseded by run {lost.owner}; stopped without writing",
                          allow_retries=False) from None
    if transient and (repeated >= resource.same_error_limit or not isinstance(decision, RetryRequested)):
        # Escalation: a transient outage pauses the pipeline; only the outage budget gives up.
        decision, err = node_outage_pause(run, own, err, repeated)
    info = error_info(err)
    try:
        if isinstance(decision, RetryRequested):
            store.pipelines.fail_node(own, op_name, info, permanent=False, data={"node": op_name, "category": category})
            context.log.warning(f"{op_name}: retryable {err}; retry {context.retry_number + 1} of "
                                f"{resource.max_retries} in {decision.seconds_to_wait:.1f} s")
            # from None: Dagster serializes the cause chain into its event log, unredacted.
            raise decision from None
        if run.node.optional:
            store.pipelines.fail_node(own, op_name, info, permanent=False, data={"node": op_name, "category": category})
            store.pipelines.degrade_node(own, op_name, info)
            context.log.warning(f"optional node {op_name} degraded, the pipeline continues without it: {err}")
            context.add_output_metadata({"recovery": NodeStatus.DEGRADED.value, "attempts": attempts,
                                         **failure_metadata(err)})
            return None
        store.pipelines.fail_node(own, op_name, info, permanent=True, data={"node": op_name, "category": category})
    except OwnershipLost as lost:
        raise Failure(description=f"superseded by run {lost.owner}; stopped without writing",
                      allow_retries=False) from exc
    context.log.error(f"{op_name} failed: {err}")
    raise decision from None

