"""Asynchronous provider jobs that survive crashes: submitted once, re-attached after a crash, never re-paid.

:func:`run_provider_job` runs one node's items as a provider job (an LLM batch, an async OCR job) through
a :class:`JobAdapter`:

* the submission's idempotency token, its items and its ledger row are written (fenced) **before** the
  job is submitted; the provider's job id is written as soon as it is known;
* while the job runs the pipeline shows ``waiting`` on that job (the reason names it; apart from outages in
  the CLI, the metrics and the report), the node's heartbeat goes on, so it is no orphan; a lost ownership
  ends the wait at once;
* under a spend cap each submission reserves its estimate first; the job's results settle it;
* after a crash the resume finds the job in the store and **re-attaches** by its id (with no id yet, by
  the token at the provider: ``adapter.find``), and never submits again; a job submitted part by part with
  no idempotency key (``submit_by_parts``) records each part as the provider accepts it, and a resume
  submits only the parts not accepted yet: the one whose submission the crash interrupted may be paid twice,
  and the ledger names it;
* results are checkpointed per item, each with its ledger row (the tokens the provider reported);
* an expired, cancelled or partly failed job, or one the provider no longer knows, is resubmitted for the
  items it left unfinished only; the ledger shows the resubmission (a row ``resubmitted``) and each
  unfinished item's error, with the provider's words in its note;
* a finished job's item its results hold nothing for is recorded ``missing_result`` (or as the adapter's
  ``JobResults.absent`` says) and redone; what the results hold for no item of the job (a stray line, a
  second answer) is ledgered, with the job's collection, and never kept.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recovery_ext._classify.classifier import ClassifiedError, classify
from recovery_ext._errors import OwnershipLost
from recovery_ext._dagster.providers import node_spend_cap
from recovery_ext._dagster.context import store_of
from recovery_ext._dagster.run_state import RunStateReporter
from recovery_ext._providers.jobs import (
    COMPLETED,
    MISSING_RESULT,
    RUNNING,
    UNFINDABLE,
    JobAdapter,
    JobResult,
    JobResults,
)
from recovery_ext._settings import check_count, check_seconds
from recovery_ext._store.ledger import IN_FLIGHT
from recovery_ext._store.models import ProviderCall, ProviderJobRow
from recovery_ext._store.statuses import JobStatus
from recovery_ext._store.models import WaitKind


def run_provider_job(ctx: Any, adapter: JobAdapter, requests: Mapping[str, Any], *, poll_seconds: float = 30.0,
                     max_attempts: int = 3, keep: Callable[[str, Any], None] | None = None,
                     prices: Any = None, estimated_tokens: int | Callable[[str, Any], int] | None = None,
                     model: str | None = None) -> int:
    """Run the unfinished ones of ``requests`` (item key -> the request) as provider jobs until each item is
    checkpointed or ``max_attempts`` submissions of it failed. ``keep(key, answer)`` checkpoints an item
    (``ctx.checkpoint(key, result, also=...)``; default: the answer is its result). ``prices``
    (:class:`Prices`) turns each item's tokens into cost. Returns how many items this call checkpointed.

    Under a spend cap (the ``recovery`` resource's ``spend_cap_*``) each submission first reserves the sum of
    its items' ``estimated_tokens`` (a number per item, or ``estimated_tokens(key, request)``; of ``model``
    under ``prices`` for a cap in money); without an estimate a submission starts only while the cap has room.
    The job's results settle the reservation, whichever run collects them."""
    check_seconds("run_provider_job(poll_seconds=...)", poll_seconds, minimum=0.01)
    check_count("run_provider_job(max_attempts=...)", max_attempts, minimum=1)
    store, own, node = store_of(ctx), ctx.ownership, ctx.node_name
    spend = node_spend_cap(ctx, prices)
    unfinished = [item.key for item in ctx.items(list(requests))]
    done = 0
    reasons: dict[str, str] = {}  # item -> why its last job left it unfinished
    if not unfinished:
        _close_kept(ctx, adapter)
    while unfinished:
        live = store.pipelines.job_live(own, node, adapter.provider)
        if live is None:
            # attempts count per item: a node that runs batch after batch (a queue drained in rounds) submits
            # each new batch as its first attempt, and only the items a job left unfinished count up
            attempt = 1 + max((r.attempt for r in store.pipelines.provider_jobs(own.pipeline_id, node)
                               if r.provider == adapter.provider and not set(r.items).isdisjoint(unfinished)),
                              default=0)
            if attempt > max_attempts:
                raise ClassifiedError(category="provider_job", retryable=False, endpoint=adapter.endpoint,
                                      message=f"{len(unfinished)} item(s) still unfinished after {max_attempts} "
                                              f"{adapter.provider} jobs{_why(unfinished, reasons)}")
            token, items = uuid.uuid4().hex, unfinished
            ctx.check_calls()
            held = None if spend is None else spend.acquire(_estimate(estimated_tokens, requests, items), model,
                                                            ref=token)
            try:
                store.pipelines.job_submitting(own, node, token=token, provider=adapter.provider, items=items,
                                               attempt=attempt, call=_submission(ctx, adapter))
            except Exception:
                if held is not None:
                    held.release()  # nothing was submitted
                raise
            job_id = _submit(ctx, adapter, requests, items, token, attempt, None)
        else:
            token, items, attempt = live.token, [k for k in live.items if k in requests], live.attempt
            expect = getattr(adapter, "expect", None)
            if expect is not None:  # an adapter that names requests by the intent (Anthropic's custom_ids)
                expect(token, {k: requests[k] for k in items}, live.created_at)
            known = live.job_id
            if known is None:  # the crash came between the token and the id: ask the provider by the token
                known = adapter.find(token)
                if known is not None:
                    store.pipelines.job_submitted(own, node, token, known, outcome=_outcome(attempt))
            if known is None:  # the provider has no job under the token yet, or finds one only by a submission
                job_id = _submit(ctx, adapter, requests, items, token, attempt, live)
                # An adapter whose submission under a token already used answers the jobs the provider started
                # (Textract's ClientRequestToken) re-attached by submitting; any other submitted the job just now.
                reattached = bool(getattr(adapter, "submit_reattaches", False))
            else:
                job_id, reattached = known, True
            if reattached:
                ctx.log.info(f"{node}: re-attached to {adapter.provider} job {_shown(job_id)} "
                             "(submitted before the crash)")
                ctx.metadata["provider_job_reattached"] = job_id
        state = _wait(ctx, adapter, job_id, poll_seconds, len(items))
        results = adapter.results(job_id)
        done += _collect(ctx, adapter, results, [k for k in items if k in unfinished], keep, prices, reasons)
        if spend is not None:  # the whole job's usage, also of the items a run before this one collected
            found = [results[k] for k in items if k in results]
            store.providers.spend_settle_ref(token, tokens=sum(r.tokens_in + r.tokens_out for r in found),
                                             cost=sum(_cost(r, prices) or 0.0 for r in found))
        finished = ctx.completed_items()
        unfinished = [k for k in unfinished if k not in finished]
        others = [k for k in (live.items if live is not None else ()) if k not in requests and k not in finished]
        if state == COMPLETED and others and not unfinished:
            # A resume given only some of a live job's items (a queue's claim): the job stays live, and the
            # call given the others re-attaches to it for theirs instead of paying for them again.
            break
        job_items = live.items if live is not None else items
        store.pipelines.job_finished(own, node, token, JobStatus.COLLECTED if state == COMPLETED else state,
                                     calls=_strays(ctx, adapter, results, job_items))
        if unfinished:
            ctx.log.warning(f"{node}: {adapter.provider} job {_shown(job_id)} ended {state} with {len(unfinished)} "
                            f"item(s) unfinished: resubmitting those only")
    ctx.flush_ledger()
    return done


def _close_kept(ctx: Any, adapter: JobAdapter) -> None:
    """A live job every item of which is already checkpointed (a kill after the last item was kept and before
    the job was marked) is collected: nothing is left to wait for."""
    store, own = store_of(ctx), ctx.ownership
    live = store.pipelines.job_live(own, ctx.node_name, adapter.provider)
    if live is not None and set(live.items) <= set(ctx.completed_items()):
        store.pipelines.job_finished(own, ctx.node_name, live.token, JobStatus.COLLECTED)


def _shown(job_id: str) -> str:
    """A job id as logs and the waiting reason show it: a group's id (one per document, for Textract) can be
    long, so past 80 characters it is cut (the full id is in the store and the output metadata)."""
    return job_id if len(job_id) <= 80 else f"{job_id[:77]}..."


def _outcome(attempt: int) -> str:
    return "submitted" if attempt == 1 else "resubmitted"


def _submission(ctx: Any, adapter: JobAdapter) -> ProviderCall:
    own = ctx.ownership
    return ProviderCall(endpoint=adapter.endpoint, outcome=IN_FLIGHT, pipeline_id=own.pipeline_id,
                        node_name=ctx.node_name, run_id=own.owner, epoch=own.epoch, operation="batch")


def _submit(ctx: Any, adapter: JobAdapter, requests: Mapping[str, Any], items: list[str], token: str,
            attempt: int, live: ProviderJobRow | None) -> str:
    wanted = {k: requests[k] for k in items}
    by_parts = getattr(adapter, "submit_by_parts", None)
    if by_parts is None:
        job_id = adapter.submit(wanted, token)
    else:
        job_id = by_parts(wanted, token, _accepted(ctx, adapter, token, live, wanted), _progress(ctx, token))
    store_of(ctx).pipelines.job_submitted(ctx.ownership, ctx.node_name, token, job_id, outcome=_outcome(attempt))
    ctx.log.info(f"{ctx.node_name}: submitted {adapter.provider} job {_shown(job_id)} ({len(items)} items, "
                 f"attempt {attempt})")
    return job_id


def _accepted(ctx: Any, adapter: JobAdapter, token: str, live: ProviderJobRow | None,
              wanted: Mapping[str, Any]) -> dict[str, str]:
    """The parts of a job submitted part by part that the provider accepted before a crash (re-used, not paid
    again); the part that was on its way then, with no answer recorded, is ledgered as maybe paid twice: the
    provider may have accepted it, and nothing can find it. With no part on its way, nothing was."""
    if live is None:
        return {}
    if live.sending is not None and live.sending not in live.accepted:
        own = ctx.ownership
        store_of(ctx).pipelines.job_part_lost(own, ctx.node_name, token, live.sending, ProviderCall(
            endpoint=adapter.endpoint, outcome=UNFINDABLE, operation="batch", pipeline_id=own.pipeline_id,
            node_name=ctx.node_name, run_id=own.owner, epoch=own.epoch,
            note=(f"{live.sending!r} may have been submitted, and paid, twice: a crash came while its submission "
                  f"was on its way to {adapter.provider}, which cannot find it; submitted again")[:500]))
        ctx.log.warning(f"{ctx.node_name}: {adapter.provider} part {live.sending!r} may have been submitted before "
                        "the crash (it cannot be found): submitting it again")
    if live.accepted:
        ctx.log.info(f"{ctx.node_name}: re-using the {len(live.accepted)} part(s) {adapter.provider} accepted before "
                     "the crash; submitting the rest")
    return {k: v for k, v in live.accepted.items() if k in wanted}


def _progress(ctx: Any, token: str) -> Callable[[str, str | None], None]:
    """What a job submitted part by part reports, each written (fenced) before its next part goes out."""
    store, own, node = store_of(ctx), ctx.ownership, ctx.node_name
    return lambda item, part: store.pipelines.job_part(own, node, token, item, part)


def _wait(ctx: Any, adapter: JobAdapter, job_id: str, poll_seconds: float, items: int) -> str:
    """Poll until the job is no longer running, the pipeline shown as waiting on the job meanwhile (its next
    check one poll ahead, on the pipeline row and in the run's event alike); the heartbeat goes on, and a lost
    ownership (or a stop) ends the wait at once. Only a job seen ending is said to have ended."""
    store, own, node = store_of(ctx), ctx.ownership, ctx.node_name
    reporter = RunStateReporter(ctx.context, node)
    reason = f"{adapter.provider} job {_shown(job_id)} ({items} items)"
    superseded = ctx.watchdog.superseded if ctx.watchdog is not None else None
    shown = False
    state: str = RUNNING
    try:
        while True:
            try:
                state = adapter.status(job_id)
            except Exception as exc:
                if not classify(exc).retryable:
                    raise
                state = RUNNING
            if state != RUNNING:
                return state
            until = store.providers.show_wait(own, poll_seconds, reason, kind=WaitKind.PROVIDER_JOB, node=node,
                                              first=not shown)
            if until is None:  # taken over (or finished by another run): not this run's wait any more
                ctx.check()
                raise OwnershipLost(owner="(another run)", pipeline_id=own.pipeline_id)
            if not shown:
                reporter.waiting(poll_seconds, reason, until=until, kind=WaitKind.PROVIDER_JOB,
                                 metadata={"provider": adapter.provider, "job_id": job_id, "items": items})
                shown = True
            if superseded is not None:
                superseded.wait(poll_seconds)
            else:
                time.sleep(poll_seconds)
            ctx.check_calls()
    finally:
        if shown:
            store.providers.clear_wait(own, kind=WaitKind.PROVIDER_JOB, node=node)
            if state != RUNNING:
                reporter.going_on(f"{adapter.provider} job {_shown(job_id)} ended: {state}")
            else:  # stopped, superseded, the run worker gone: the job goes on at the provider
                reporter.left(f"stopped waiting on {adapter.provider} job {_shown(job_id)}, which is still running "
                              "at the provider: a resume re-attaches to it")


def _estimate(estimated: int | Callable[[str, Any], int] | None, requests: Mapping[str, Any],
              items: list[str]) -> int:
    """A submission's estimated tokens: the sum of its items' (1 without an estimate: it needs room left)."""
    if estimated is None:
        return 1
    if callable(estimated):
        return sum(max(0, int(estimated(k, requests[k]))) for k in items)
    return max(0, int(estimated)) * len(items)


def _cost(found: JobResult, prices: Any) -> float | None:
    """An item's cost: the adapter's, else its tokens under ``prices`` (unknown when its usage was unreadable)."""
    if found.cost is not None or prices is None or found.note is not None:
        return found.cost
    cost: float | None = prices.cost(found.model, found.tokens_in, found.tokens_out)
    return cost


def _why(unfinished: list[str], reasons: dict[str, str]) -> str:
    shown = [f"{key}: {reasons[key]}" for key in unfinished[:5] if key in reasons]
    return f" ({'; '.join(shown)}{'; ...' if len(unfinished) > 5 else ''})" if shown else ""


def _strays(ctx: Any, adapter: JobAdapter, results: Mapping[str, JobResult], items: Sequence[str]
            ) -> list[ProviderCall]:
    """The ledger rows of what a job's results hold for none of its items: its strays, and answers to an item
    the job does not hold (all paid for, none kept), bound to this node; written with the job's collection."""
    found = list(getattr(results, "strays", ()))
    if isinstance(results, JobResults):  # a lazily read mapping holds the job's items only
        held = set(items)
        found += [JobResult(error="unknown_item", tokens_in=r.tokens_in, tokens_out=r.tokens_out, model=r.model,
                            note=f"an answer for {key!r}, no item of the job"[:500])
                  for key, r in results.items() if key not in held]
    own = ctx.ownership
    return [ProviderCall(endpoint=adapter.endpoint, model=r.model, tokens_in=r.tokens_in, tokens_out=r.tokens_out,
                         outcome=r.error or "unknown_item", operation="batch", note=r.note,
                         pipeline_id=own.pipeline_id, node_name=ctx.node_name, run_id=own.owner, epoch=own.epoch)
            for r in found]


def _collect(ctx: Any, adapter: JobAdapter, results: Mapping[str, JobResult], keys: list[str],
             keep: Callable[[str, Any], None] | None, prices: Any, reasons: dict[str, str]) -> int:
    """Checkpoint each finished item with its ledger row; an item with an error gets its row only, and so does
    one the finished job has no result for (``missing_result``, or the adapter's ``absent``)."""
    done = 0
    absent = getattr(results, "absent", None) or JobResult(error=MISSING_RESULT)
    for key in keys:
        found = results.get(key) or absent
        if found.error is not None:
            reasons[key] = f"{found.error}{f' ({found.note})' if found.note else ''}"[:300]
        cost = _cost(found, prices)
        ctx.record_call(ProviderCall(endpoint=adapter.endpoint, model=found.model, tokens_in=found.tokens_in,
                                     tokens_out=found.tokens_out, outcome=found.error or "ok",
                                     cost=cost if found.error is None else None, operation="batch",
                                     note=found.note), item=key)
        if found.error is None:
            if keep is not None:
                keep(key, found.answer)
            else:
                ctx.checkpoint(key, found.answer)
            done += 1
    return done
