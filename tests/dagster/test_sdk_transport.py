"""The real openai and anthropic SDKs through LLMResource's journaling transport, against a stand-in on 127.0.0.1
(SQLite and PostgreSQL): sync, async and streamed requests are answered, recorded in the ledger with the usage
the answer reported, and kept; a step retry (a re-execution of the node) that asks the same gets every answer
from the journal and sends nothing; a 503 is retried under the shared policy; outside a node the clients are
plain SDK clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dagster import DagsterInstance, Failure, ReexecutionOptions, execute_job, in_process_executor
from dagster._core.definitions.reconstruct import ReconstructableRepository
from ledger_defs import recovery_resource
from sdk_stand_in import SdkStandIn
from sqlalchemy import select

from recovery_ext import ClassifiedError, LLMResource, NodeContext, execute_in_process, recoverable_job, recoverable_op
from recovery_ext._store.models import pipeline_scope
from recovery_ext._store.schema import call_journal, provider_calls

MODES = ("sync", "async", "stream", "astream")
ANSWERS: list[dict] = []


def ask(llm: LLMResource, mode: str, question: str) -> str:
    """One question through the SDK ``llm.provider`` names, in ``mode``; the answer's text."""
    messages = [{"role": "user", "content": question}]
    if llm.provider == "openai":
        kwargs = {"model": llm.model, "messages": messages, "max_tokens": 64}
        if mode == "sync":
            return llm.get_client().chat.completions.create(**kwargs).choices[0].message.content
        if mode == "stream":
            chunks = llm.get_client().chat.completions.create(**kwargs, stream=True,
                                                              stream_options={"include_usage": True})
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        async def run() -> str:
            client = llm.get_async_client()
            if mode == "async":
                return (await client.chat.completions.create(**kwargs)).choices[0].message.content
            chunks = await client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

        return asyncio.run(run())
    kwargs = {"model": llm.model, "messages": messages, "max_tokens": 64}
    if mode == "sync":
        return llm.get_client().messages.create(**kwargs).content[0].text
    if mode == "stream":
        with llm.get_client().messages.stream(**kwargs) as stream:
            return "".join(stream.text_stream)

    async def run_anthropic() -> str:
        client = llm.get_async_client()
        if mode == "async":
            return (await client.messages.create(**kwargs)).content[0].text
        async with client.messages.stream(**kwargs) as stream:
            return "".join([text async for text in stream.text_stream])

    return asyncio.run(run_anthropic())


@recoverable_op(required_resource_keys={"llm"})
def every_mode(ctx: NodeContext) -> list:
    """Each item asks once, in its own mode. The first attempt fails after every answer arrived and before any
    item completed: its retry (a re-execution of the node) asks the same again."""
    llm = ctx.context.resources.llm
    answers = {}
    for item in ctx.items(MODES):
        answers[item.key] = ask(llm, item.key, f"question {item.key}")
        if ctx.context.retry_number > 0:
            item.complete(answers[item.key])
    ANSWERS.append(answers)
    if ctx.context.retry_number == 0:
        raise ClassifiedError(category="server_error", retryable=True, message="failed after the answers arrived")
    return sorted(ctx.completed_items())


@recoverable_op(required_resource_keys={"llm"})
def once(ctx: NodeContext) -> str:
    for item in ctx.items(["only"]):
        item.complete(ask(ctx.context.resources.llm, "sync", "question only"))
    return "done"


SETTINGS = {"provider": "openai", "mode": "sync"}


@recoverable_op(required_resource_keys={"llm"})
def once_in_mode(ctx: NodeContext) -> str:
    for item in ctx.items(["only"]):
        item.complete(ask(ctx.context.resources.llm, SETTINGS["mode"], "question only"))
    return "done"


def run(op, llm: LLMResource, db_url: str, monkeypatch, **recovery):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)

    @recoverable_job(name=f"sdk_{op.name}", executor_def=in_process_executor)
    def job():
        op()

    with DagsterInstance.ephemeral() as instance:
        return execute_in_process(job, instance=instance,
                                  resources={"recovery": recovery_resource(**recovery), "llm": llm})


def ledger(store) -> list:
    c = provider_calls.c
    with store.read() as conn:
        return conn.execute(select(c.item_key, c.outcome, c.tokens_in, c.tokens_out, c.replays, c.model, c.note)
                            .order_by(c.item_key, c.recorded_at)).all()


def journal_entries(store) -> list:
    with store.read() as conn:
        return conn.execute(select(call_journal.c.item_key, call_journal.c.answer)).all()


@pytest.fixture
def stand_in():
    server = SdkStandIn()
    url = server.start()
    yield server, url
    server.stop()


def resource(provider: str, url: str, **overrides) -> LLMResource:
    base = f"{url}/v1" if provider == "openai" else url
    return LLMResource(**{"provider": provider, "base_url": base, "model": "m", "api_key": "sk-test", "timeout": 10,
                          "initial_delay": 0.05, "max_delay": 1.0, **overrides})


@pytest.mark.parametrize("gzip_streams", [False, True], ids=["plain", "gzip_streams"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_sync_async_and_streamed_answers_are_recorded_and_a_re_execution_sends_nothing(
        provider, gzip_streams, stand_in, store, db_url, monkeypatch):
    """A gzip-encoded stream is decoded as it is teed: the SDK reads it as it arrives, and its text is kept."""
    server, url = stand_in
    server.gzip_streams = gzip_streams
    ANSWERS.clear()
    result = run(every_mode, resource(provider, url), db_url, monkeypatch)
    assert result.success
    first, retried = ANSWERS
    assert first == retried == {mode: f"answer to question {mode}" for mode in MODES}
    sent = server.answered()
    assert sorted(r.question for r in sent) == sorted(f"question {mode}" for mode in MODES)  # the retry sent nothing
    assert sorted(r.streamed for r in sent) == [False, False, True, True]
    charged = {r.question.split()[-1]: (r.tokens_in, r.tokens_out) for r in sent}
    rows = ledger(store)
    # one row per request, each for its own item, with the usage the answer reported; each kept answer replayed
    assert [(r.item_key, r.outcome, (r.tokens_in, r.tokens_out), r.replays, r.model) for r in rows] == [
        (mode, "ok", charged[mode], 1, "m") for mode in sorted(MODES)]


def test_a_503_is_retried_under_the_shared_policy_and_both_attempts_are_in_the_ledger(stand_in, store, db_url,
                                                                                      monkeypatch):
    server, url = stand_in
    server.script = [503]
    result = run(once, resource("openai", url), db_url, monkeypatch)
    assert result.success
    assert server.statuses() == [503, 200]  # the SDK's own retries are off: only the policy's retry was sent
    assert [(r.item_key, r.outcome) for r in ledger(store)] in (
        [("only", "server_error"), ("only", "ok")], [("only", "ok"), ("only", "server_error")])


def test_a_refusal_reaches_the_sdk_as_its_own_error_and_is_not_kept(stand_in, store, db_url, monkeypatch):
    import openai

    server, url = stand_in
    server.script = [400]
    with pytest.raises(openai.BadRequestError):
        resource("openai", url).get_client().chat.completions.create(model="m", messages=[])  # outside a node
    server.script = [400]
    with pytest.raises(Failure, match="HTTP 400"):
        run(once, resource("openai", url), db_url, monkeypatch)
    assert server.statuses() == [400, 400]  # permanent: not retried, neither by the policy nor by the node
    assert [(r.item_key, r.outcome) for r in ledger(store)] == [("only", "validation")]


def test_outside_a_node_the_clients_are_plain_sdk_clients(stand_in):
    server, url = stand_in
    for provider in ("openai", "anthropic"):
        llm = resource(provider, url)
        assert ask(llm, "sync", "q") == ask(llm, "async", "q") == "answer to q"
    assert len(server.answered()) == 4  # nothing journaled: each call was sent


# -- an answer no client can read: a 200 application/json whose body is cut off ----------------------------------

NOTES = {"truncated": "not JSON", "error_200": "the provider's error", "no_answer_list": "without its",
         "html_200": "an HTML page", "corrupt_gzip": "not gzip"}


@pytest.mark.parametrize("fault", sorted(NOTES))
@pytest.mark.parametrize(("provider", "mode"), [("openai", "sync"), ("openai", "async"), ("anthropic", "sync")])
def test_a_200_that_is_no_answer_is_a_failed_attempt_retried_under_the_policy_and_never_kept(
        fault, provider, mode, stand_in, store, db_url, monkeypatch):
    """Before: the cut-off body was kept and recorded as answered, the SDK failed parsing it (a JSONDecodeError,
    permanent): the item failed, and every re-execution replayed the same body. A new user's trial found the same
    for the provider's error with a 200, for JSON without `choices` (the caller failed on None, permanent) and for
    a proxy's HTML page: all kept and replayed; and a corrupt gzip body left its ledger row `unknown`."""
    server, url = stand_in
    server.script = [fault]
    monkeypatch.setitem(SETTINGS, "mode", mode)
    result = run(once_in_mode, resource(provider, url), db_url, monkeypatch)
    assert result.success
    assert len(server.truncated()) == 1 and len(server.answered()) == 1  # the policy asked again, once
    rows = ledger(store)
    assert sorted(r.outcome for r in rows) == ["ok", "unreadable_result"]
    [bad] = [r for r in rows if r.outcome == "unreadable_result"]
    assert (bad.tokens_in, bad.tokens_out) == (0, 0) and NOTES[fault] in bad.note, bad.note


@pytest.mark.parametrize("cut", ["truncated", "cut_then_blank_line", "cut_between_events", "error_event",
                                 "corrupt_gzip"])
@pytest.mark.parametrize(("provider", "mode"), [("openai", "stream"), ("openai", "astream"), ("anthropic", "stream"),
                                             ("anthropic", "astream")])
def test_a_stream_cut_off_before_its_end_is_a_failed_attempt_never_kept_and_the_retry_asks_again(
        cut, provider, mode, stand_in, store, db_url, monkeypatch):
    """Before: the stream ended cleanly inside its second text event (or after it, without the events that end an
    answer), the SDK dropped that half event (or saw nothing amiss), and the item completed with half of the answer,
    which the journal kept for every re-execution. Now the stream raises UnreadableAnswer (retryable) to the SDK
    once it ends, the node's retry asks the provider again, and only the whole answer is kept. An error event (a
    provider overloaded mid-answer) is never kept either, whichever error the SDK raises first."""
    server, url = stand_in
    server.script = [cut]
    monkeypatch.setitem(SETTINGS, "mode", mode)
    result = run(once_in_mode, resource(provider, url), db_url, monkeypatch)
    assert result.success
    assert len(server.truncated()) == 1 and len(server.answered()) == 1 and server.answered()[0].streamed
    [pipeline] = store.reports.list_pipelines()
    assert store.pipelines.completed_items(pipeline.id, "once_in_mode") == {"only": "answer to question only"}
    rows = ledger(store)
    assert sorted(r.outcome for r in rows) == ["ok", "unreadable_result"]
    [bad] = [r for r in rows if r.outcome == "unreadable_result"]
    assert (bad.tokens_in, bad.tokens_out) == (0, 0) and "not kept" in bad.note
    assert {"truncated": "of the stream", "cut_then_blank_line": "of the stream", "corrupt_gzip": "not gzip",
            "error_event": "the provider ended on its error"}.get(cut, "cut off before its end") in bad.note, bad.note
    if cut == "error_event" and provider == "anthropic":  # the provider's own words, not a cut connection
        assert "ending on the provider's overloaded_error: Overloaded" in bad.note, bad.note
    [good] = [r for r in rows if r.outcome == "ok"]
    assert good.tokens_in > 0 and good.replays == 0  # the whole answer, with its usage; nothing replayed


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_stream_cut_before_the_usage_it_asked_for_is_kept_and_counted_at_its_estimate(
        mode, stand_in, store, db_url, monkeypatch):
    """The request asked for the usage chunk (``stream_options.include_usage``), and the stream ended after every
    choice finished, before that chunk and ``[DONE]``. Before: it was recorded as 0 tokens, so the ledger and the
    spend caps under-counted what the provider billed. The answer is whole, so it is kept (asking again to learn
    its usage would pay twice) and counted at its estimate: the request's tokens, and its max_tokens out."""
    server, url = stand_in
    server.script = ["cut_before_usage"]
    monkeypatch.setitem(SETTINGS, "mode", mode)
    result = run(once_in_mode, resource("openai", url), db_url, monkeypatch)
    assert result.success
    assert len(server.requests) == 1  # kept: not asked again
    [pipeline] = store.reports.list_pipelines()
    assert store.pipelines.completed_items(pipeline.id, "once_in_mode") == {"only": "answer to question only"}
    [row] = ledger(store)
    assert row.outcome == "ok" and "counted at its estimate" in row.note, row.note
    assert row.tokens_out == 64 and row.tokens_in > 0  # max_tokens, and the request's own estimate


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_an_answer_without_usage_counts_at_its_estimate_under_a_spend_cap(mode, stand_in, store, db_url, monkeypatch):
    """A new user's trial: an answer that says nothing of its usage (a stream that never asked for it, a server
    that leaves `usage` out) was settled as 0 tokens, so a spend cap let every such call through; the docs say it
    counts at its estimate, as it does through provider_guard. Now it does through the SDK clients too."""
    server, url = stand_in
    server.no_usage = True
    monkeypatch.setitem(SETTINGS, "mode", mode)
    result = run(once_in_mode, resource("openai", url), db_url, monkeypatch, spend_cap_tokens=10_000)
    assert result.success and len(server.requests) == 1
    [row] = ledger(store)
    [pipeline] = store.reports.list_pipelines()
    capped = store.providers.spend_cap(pipeline_scope(pipeline.id))
    # the stream asked for its usage (ask() sets include_usage): the ledger counts it at its estimate too; the
    # plain answer's row says the provider said nothing
    assert (row.tokens_in + row.tokens_out > 0) if mode == "stream" else (row.tokens_in, row.tokens_out) == (0, 0)
    assert capped.spent_tokens > 64 and capped.reserved_tokens == 0  # at least its max_tokens: the estimate


@recoverable_op(required_resource_keys={"llm"})
def asked_twice(ctx: NodeContext) -> str:
    """Asks once; the first attempt then fails, and its retry (a re-execution of the node) asks the same again."""
    for item in ctx.items(["only"]):
        ANSWERS.append({"answer": ask(ctx.context.resources.llm, SETTINGS["mode"], "question only")})
        if ctx.context.retry_number == 0:
            raise ClassifiedError(category="server_error", retryable=True, message="failed after the answer")
        item.complete(ANSWERS[-1]["answer"])
    return "done"


@pytest.mark.parametrize("tail", ["slow", "reset"])
@pytest.mark.parametrize(("provider", "mode"), [("openai", "stream"), ("openai", "astream"), ("anthropic", "stream"),
                                             ("anthropic", "astream")])
def test_a_whole_stream_whose_connection_ends_late_or_badly_is_kept_and_replayed_not_paid_again(
        tail, provider, mode, stand_in, store, db_url, monkeypatch):
    """The stream's last event came, then its connection stayed open 0.5 s more (a slow proxy), or was closed
    before the chunked body's end (a proxy's reset). The OpenAI async SDK drains a slow tail under a 0.1 s
    timeout, then cancels the read; a reset reaches an SDK that reads to the end (Anthropic's) as an error. Before:
    the attempt was recorded as failed and its answer not kept, although the provider had finished (and billed) it:
    the retry asked again and paid twice (and after a reset the caller failed). Now a stream that reached its end
    is recorded and kept whatever stops its tail, and the retry replays it."""
    server, url = stand_in
    server.slow_tail = 0.5 if tail == "slow" else 0.0
    server.reset_tail = tail == "reset"
    ANSWERS.clear()
    monkeypatch.setitem(SETTINGS, "mode", mode)
    result = run(asked_twice, resource(provider, url), db_url, monkeypatch)
    assert result.success
    assert ANSWERS == [{"answer": "answer to question only"}] * 2
    assert len(server.requests) == 1  # the retry replayed the kept answer
    [row] = ledger(store)
    charged = server.requests[0]
    assert (row.outcome, row.tokens_in, row.tokens_out, row.replays) == (
        "ok", charged.tokens_in, charged.tokens_out, 1)


HERE = Path(__file__).resolve().parents[1] / "support"


@pytest.mark.parametrize("kept_before_the_fix", [False, True], ids=["cut_off_now", "kept_before_the_fix"])
def test_after_cut_off_answers_fail_the_run_a_re_execution_asks_the_provider_again_and_completes(
        kept_before_the_fix, stand_in, store, db_url, instance, monkeypatch):
    """The user trial: every answer cut off until the give-up fails the run. No entry of the journal keeps a cut-off
    body, so a re-execution once the provider is healthy asks again and completes. A cut-off body a journal kept
    before answers were checked (simulated by switching the check off for the first run) is not replayed either:
    it is dropped and asked again."""
    from recovery_ext._providers import http_answers, transport

    server, url = stand_in
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    monkeypatch.setenv("CUT_OFF_LLM_URL", f"{url}/v1")
    if kept_before_the_fix:
        monkeypatch.setattr(transport, "check_answer", lambda *args: http_answers.NOT_READ)
    server.script = ["truncated"] * 10_000
    job = ReconstructableRepository.for_module("cut_off_answer_defs", "defs", working_directory=str(HERE)) \
        .get_reconstructable_job("ask_job")
    with execute_job(job, instance=instance, raise_on_error=False) as first:
        assert not first.success
        first_id = first.run_id
    [pipeline] = store.reports.list_pipelines()
    assert pipeline.status == "failed" and server.answered() == []
    # the items run in turn: the first one's failure failed the node
    if kept_before_the_fix:  # the old behaviour: the cut-off body kept, its call recorded as answered
        assert [e.item_key for e in journal_entries(store)] == ["a"]
        assert [(r.item_key, r.outcome) for r in ledger(store)] == [("a", "ok")]
    else:
        assert journal_entries(store) == []  # nothing a re-execution could replay
        rows = ledger(store)  # one row per request sent (the policy's retries), none said to be answered
        assert len(rows) == len(server.truncated()) > 1
        assert {(r.item_key, r.outcome) for r in rows} == {("a", "unreadable_result")}
    sent_before = len(server.requests)

    monkeypatch.undo()  # the provider is healthy again, the check back on; the same database and stand-in
    server.script = []
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    monkeypatch.setenv("CUT_OFF_LLM_URL", f"{url}/v1")
    parent = {"dagster/parent_run_id": first_id, "dagster/root_run_id": first_id}
    with execute_job(job, instance=instance, tags=parent,
                     reexecution_options=ReexecutionOptions.from_failure(first_id, instance)) as second:
        assert second.success
        assert second.output_for_node("ask_llm") == ["a", "b"]
    assert sorted(r.question for r in server.requests[sent_before:]) == ["question a", "question b"]
    assert all(not r.truncated for r in server.requests[sent_before:])
    assert store.pipelines.get_pipeline(pipeline.id).status == "completed"
    answered = [r for r in ledger(store) if r.outcome == "ok" and r.tokens_in > 0]
    assert sorted(r.item_key for r in answered) == ["a", "b"]  # the new answers, with their usage
    if kept_before_the_fix:  # the kept body's own row stays as it was written, its look-up counted as a replay
        assert [(r.item_key, r.tokens_in, r.replays) for r in ledger(store) if r.tokens_in == 0] == [("a", 0, 1)]


def ask_each_key(item) -> str:
    return ask(SETTINGS["llm"], SETTINGS["mode"], f"question {item.key}")


async def ask_each_key_async(item) -> str:
    messages = [{"role": "user", "content": f"question {item.key}"}]
    async with SETTINGS["llm"].get_async_client().messages.stream(model="m", messages=messages,
                                                                  max_tokens=64) as stream:
        return "".join([text async for text in stream.text_stream])


@recoverable_op(required_resource_keys={"llm"})
def mapped(ctx: NodeContext) -> int:
    SETTINGS["llm"] = ctx.context.resources.llm
    keys = ["a", "b"]
    if SETTINGS["mode"] == "astream":
        asyncio.run(ctx.amap(ask_each_key_async, keys, concurrency=2))
    else:
        ctx.map(ask_each_key, keys, concurrency=2)
    return len(ctx.completed_items())


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_mapped_items_whose_streams_keep_ending_on_the_providers_overload_pause_and_complete(
        mode, stand_in, store, db_url, monkeypatch):
    """A provider overloaded for a while ends each streamed answer on an error event, after its first text: the
    SDK raises it after the transport's guarded call returned, so each item's own retry meets it. Before: an item's
    ``same_error_limit``-th overload in a row was made permanent (EscalatedError), so one busy stretch failed the
    node and the pipeline for good. Now the item stops retrying and stays transient: the node retries or pauses, as
    for any transient error (only the outage budget gives up), and completes once the provider is back."""
    server, url = stand_in
    server.script = ["error_event"] * 6  # three in a row for each of the two items
    monkeypatch.setitem(SETTINGS, "mode", mode)
    result = run(mapped, resource("anthropic", url), db_url, monkeypatch, same_error_limit=3, max_retries=3,
                 outage_pause_initial=0.05, outage_pause_max=0.1, breaker_failure_threshold=100)
    assert result.success
    assert len(server.truncated()) == 6 and len(server.answered()) == 2
    [pipeline] = store.reports.list_pipelines()
    assert store.pipelines.completed_items(pipeline.id, "mapped") == {
        "a": "answer to question a", "b": "answer to question b"}
    assert store.pipelines.get_pipeline(pipeline.id).status == "completed"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_answer_the_store_cannot_keep_is_not_asked_again_and_the_pipeline_is_left_to_recovery(
        mode, stand_in, store, db_url, monkeypatch):
    """The provider answered, and keeping the answer failed: the recovery database stayed unavailable past the
    store's retries. Before: the guard's policy called that transient and sent the request again, paying a second
    time for an answer it had in hand (and again on every further failure). Now a store error is no provider
    failure: nothing is sent again, the step fails as the database's outage, and the pipeline is left to
    recovery, whose resume asks once the database is back."""
    from recovery_ext._errors import StoreUnavailable
    from recovery_ext._providers.journal import PendingCall

    server, url = stand_in
    keep, refused = PendingCall.answered, []

    def unavailable_once(self, answer):
        if not refused:
            refused.append(answer)
            raise StoreUnavailable("the database is unavailable: server closed the connection unexpectedly")
        return keep(self, answer)

    monkeypatch.setattr(PendingCall, "answered", unavailable_once)
    monkeypatch.setitem(SETTINGS, "mode", mode)
    with pytest.raises(Failure, match="recovery database is unavailable"):
        run(once_in_mode, resource("openai", url), db_url, monkeypatch)
    assert refused and len(server.requests) == 1  # paid once
    [pipeline] = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(pipeline.id).status == "running"


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_stream_always_cut_off_gives_up_at_the_outage_budget(mode, stand_in, store, db_url, monkeypatch):
    """A hostile trial: every answer's stream was cut off mid-event. Its headers ended the node's outage (the
    pause the breaker's cool-down had shown) as an answer would, restarting the outage clock at each call. A
    stream's end decides now: a cut-off one leaves the outage going, and the budget gives up (here the stand-in
    answers whole after 80 cut-off streams)."""
    server, url = stand_in
    server.script = ["truncated"] * 80
    monkeypatch.setitem(SETTINGS, "mode", mode)
    with pytest.raises(Failure, match="outage budget"):
        run(once_in_mode, resource("openai", url), db_url, monkeypatch, outage_budget_seconds=1.0,
            outage_pause_initial=0.05, outage_pause_max=0.1, breaker_failure_threshold=1, breaker_cooldown=0.2,
            breaker_max_cooldown=0.2, max_retries=2)
    assert not server.answered() and 0 < len(server.truncated()) < 80
    [pipeline] = store.reports.list_pipelines()
    events = [t["event"] for t in store.reports.transitions_for(pipeline_id=pipeline.id, entity_type="pipeline")]
    assert "outage_pause" in events and "outage_over" not in events, events  # no cut-off stream ended it
