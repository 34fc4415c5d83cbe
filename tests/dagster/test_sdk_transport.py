"""The real openai and anthropic SDKs through LLMResource's journaling transport, against a stand-in on 127.0.0.1
(SQLite and PostgreSQL): sync, async and streamed requests are answered, recorded in the ledger with the usage
the answer reported, and kept; a step retry (a re-execution of the node) that asks the same gets every answer
from the journal and sends nothing; a 503 is retried under the shared policy; outside a node the clients are
plain SDK clients."""

from __future__ import annotations

import asyncio

import pytest
from dagster import DagsterInstance, Failure, in_process_executor
from ledger_defs import recovery_resource
from sdk_stand_in import SdkStandIn
from sqlalchemy import select

from recovery_ext import ClassifiedError, LLMResource, NodeContext, execute_in_process, recoverable_job, recoverable_op
from recovery_ext._store.schema import provider_calls

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


def run(op, llm: LLMResource, db_url: str, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)

    @recoverable_job(name=f"sdk_{op.name}", executor_def=in_process_executor)
    def job():
        op()

    with DagsterInstance.ephemeral() as instance:
        return execute_in_process(job, instance=instance, resources={"recovery": recovery_resource(), "llm": llm})


def ledger(store) -> list:
    c = provider_calls.c
    with store.read() as conn:
        return conn.execute(select(c.item_key, c.outcome, c.tokens_in, c.tokens_out, c.replays, c.model)
                            .order_by(c.item_key, c.recorded_at)).all()


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


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_sync_async_and_streamed_answers_are_recorded_and_a_re_execution_sends_nothing(
        provider, stand_in, store, db_url, monkeypatch):
    server, url = stand_in
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
