"""Hostile provider answers, round three: an odd Retry-After, malformed usage, NUL bytes, absurd prices.

A provider's answer already paid for is never thrown away because its metadata is odd: the retry
wait ignores a Retry-After it cannot read, and the ledger records what it can (unknown for the rest).
"""

from __future__ import annotations

import json

import pytest
from dagster import DagsterInstance, in_process_executor, job
from werkzeug import Response

from ledger_defs import llm_resource, make_ledger_job, recovery_resource
from outage_kit import NOW, FakeTime, answer, enricher, plain_guard, serve, store_guard

from recovery_ext import ConfigurationError, Prices, RecoveryResource, execute_in_process, read_usage, recoverable_op
from recovery_ext._dagster.executor import with_recovery
from recovery_ext._classify.classifier import parse_retry_after
from recovery_ext._store.models import ItemCheckpoint, ProviderCall
import store_rows


@pytest.mark.parametrize("value", ["\u00b2", "\u0661\u0662", "\uff13", "1.5", "-3", "+3", " 3 0", "9" * 400,
                                   "Mon, 99 Foo 99999999 99:99:99 GMT", "\x00"])
def test_a_retry_after_that_is_not_ascii_digits_or_an_http_date_is_ignored(value):
    assert parse_retry_after(value, now=NOW) is None


def test_retry_after_still_reads_digits_and_http_dates():
    assert parse_retry_after(" 7 ", now=NOW) == 7.0
    assert parse_retry_after("Thu, 01 Jan 2030 00:00:10 GMT", now=1893456000.0) == 10.0


def test_a_superscript_retry_after_on_a_503_falls_back_to_backoff_through_the_guard(httpserver):
    # One byte 0xB2 on the wire: "²" to a latin-1 decoder, a digit to str.isdigit().
    busy = Response('{"error":{"message":"busy"}}', status=503, content_type="application/json")
    busy.headers.set("Retry-After", "\u00b2")
    seen = serve(httpserver, [busy, answer(200)])
    fake = FakeTime()
    assert enricher(httpserver, guard_for=plain_guard(fake)).complete_json("glossary", {}) == {"ok": True}
    assert fake.slept == [1.0] and len(seen) == 2  # the policy's own first backoff, not a ValueError


# -- malformed usage, NUL bytes, absurd prices --------------------------------------------------------

def usage_answer(prompt_tokens, completion_tokens=3):
    body = {"id": "1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": '{"name": "x", "description": "y"}'}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": 1}}
    return Response(json.dumps(body), content_type="application/json")


ODD_USAGE = [-5, "12abc", float("nan"), 1e30, 2**70, True, "\u00b2", [1], {"a": 1}]


@pytest.mark.parametrize("odd", ODD_USAGE, ids=repr)
def test_odd_usage_is_read_as_unknown_with_a_note_never_an_error(odd):
    usage = read_usage({"prompt_tokens": odd, "completion_tokens": 7})
    assert usage.tokens_in == 0 and usage.tokens_out == 7 and "prompt_tokens" in usage.note
    assert read_usage({"prompt_tokens": 12, "completion_tokens": 7.0}) == (12, 7, None)
    assert read_usage(None) == (0, 0, None)  # no usage at all: nothing charged, nothing odd


def test_a_paid_answer_with_malformed_usage_completes_its_item_and_is_recorded_with_a_note(httpserver, db_url, store,
                                                                                          monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    answers = [usage_answer(odd) for odd in ("12abc", -5, "NaN", 1e30)] + [usage_answer(11)]
    serve(httpserver, answers)
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(make_ledger_job(in_process_executor), instance=instance,
                                    run_config={"ops": {"ask": {"config": {"items": 4}}}},
                                    resources={"recovery": recovery_resource(),
                                               "llm": llm_resource(httpserver.url_for("/v1"))})
    assert result.success
    calls = store_rows.provider_calls(store)
    assert len(calls) == 5 and all(c.outcome == "ok" for c in calls)
    odd = [c for c in calls if c.note]
    assert len(odd) == 4 and all(c.tokens_in == 0 and c.cost is None and "prompt_tokens" in c.note for c in odd)
    [good] = [c for c in calls if not c.note]
    assert good.tokens_in == 11 and good.cost == pytest.approx((11 * 1.5 + 3 * 6.0) / 1e6)


def test_a_nul_or_a_lone_surrogate_in_a_calls_text_never_fails_the_checkpoint_on_either_database(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1", params={})
    store.pipelines.start_node(own, "a")
    nul = ProviderCall(endpoint="http://127.0.0.1:9/v\x001", model="m\x00", outcome="ok", tokens_in=1,
                       response_model="r\x00", pipeline_id=own.pipeline_id, node_name="a", item_key="k",
                       run_id="run-1", epoch=own.epoch)
    failed = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", outcome="rate\x00limit",
                          pipeline_id=own.pipeline_id, node_name="a", item_key="k", run_id="run-1", epoch=own.epoch)
    # a provider's JSON may escape half a surrogate pair ("\ud83d" alone): json.loads gives a lone surrogate
    lone = ProviderCall(endpoint="http://127.0.0.1:9/v1", model=json.loads('"gpt-\\ud83d"'), outcome="ok",
                        note="é \udcff 😀", pipeline_id=own.pipeline_id, node_name="a", item_key="k", run_id="run-1",
                        epoch=own.epoch)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k", 1, calls=(nul, failed)))
    store.pipelines.checkpoint_items(own, "a", [ItemCheckpoint("j", 2, calls=(lone,))], stall_timeout=30)
    stored = {c.id: c for c in store_rows.provider_calls(store, own.pipeline_id)}
    assert stored[nul.id].model == "m\ufffd" and "\x00" not in stored[nul.id].endpoint
    assert stored[failed.id].outcome == "rate\ufffdlimit"
    assert (stored[lone.id].model, stored[lone.id].note) == ("gpt-\ufffd", "é \ufffd 😀")  # the rest kept as it was
    assert store_rows.reached_checkpoint(store, [nul.id, failed.id, lone.id]) == {
        nul.id: True, failed.id: False, lone.id: True}


@pytest.mark.parametrize("price", [1e308, 1e7, float("inf"), -1.0])
def test_prices_refuse_absurd_or_non_finite_prices(price):
    with pytest.raises(ConfigurationError, match="per million tokens"):
        Prices.parse({"m": {"input": price, "output": 1.0}})
    assert Prices.parse({"m": {"input": 1e6, "output": 0}}).cost("m", 2**62 - 1, 0) < float("inf")


@pytest.mark.parametrize("price", [1e7, float("inf"), float("nan"), -1.0])
def test_a_price_out_of_range_is_refused_when_the_resource_is_built_before_any_run(price):
    """Issue 27: at definitions load, with the setting named, not as a permanent error inside the first op."""
    # pydantic's ValidationError carries it (a ValueError, as ConfigurationError is): the definitions make it one line
    with pytest.raises(ValueError, match=r"the input price of model 'm' must be a number from 0 to 1e\+06"):
        llm_resource("http://127.0.0.1:9/v1", prices={"m": {"input": price, "output": 1.0}})
    with pytest.raises(ValueError, match="must be {'input': ..., 'output': ...}"):
        llm_resource("http://127.0.0.1:9/v1", prices={"m": {"input": 1.0, "dollars": 2.0}})
    assert llm_resource("http://127.0.0.1:9/v1", prices={"m": {"input": 1e6, "output": 0}}).prices["m"]["input"] == 1e6


@pytest.mark.parametrize("bad,words", [
    (dict(timeout=-1), "timeout must be at least 0.1 s, got -1"),
    (dict(timeout=0), "timeout must be at least 0.1 s, got 0"),
    (dict(timeout=float("nan")), "timeout must be a finite number of seconds, got nan"),
    (dict(timeout=float("inf")), "timeout must be a finite number of seconds, got inf"),
    (dict(timeout=2 * 86400), "timeout must be at most 86400 s"),
    (dict(initial_delay=float("inf")), "initial_delay must be a finite number of seconds, got inf"),
    (dict(initial_delay=-0.5), "initial_delay must be at least 0 s, got -0.5"),
    (dict(max_delay=float("nan")), "max_delay must be a finite number of seconds, got nan"),
    (dict(initial_delay=10, max_delay=5), "initial_delay must be at most max_delay (5 s), got 10"),
    (dict(max_tokens=-10), "max_tokens must be a whole number from 1 to 10000000, got -10"),
    (dict(max_tokens=0), "max_tokens must be a whole number from 1 to 10000000, got 0"),
    (dict(base_url="not a url"), "base_url must be an http:// or https:// URL with a host"),
    (dict(base_url="ftp://llm.local/v1"), "base_url must be an http:// or https:// URL with a host"),
    (dict(base_url="http://llm.local:99999/v1"), "base_url must be an http:// or https:// URL with a host"),
    (dict(budget_window_seconds=float("nan")), "budget_window_seconds must be a finite number of seconds"),
    (dict(budget_margin_seconds=float("inf")), "budget_margin_seconds must be a finite number of seconds"),
    (dict(requests_per_minute=0), "requests_per_minute must be a whole number from 1"),
])
def test_an_llm_setting_out_of_range_is_refused_when_the_resource_is_built_naming_it(bad, words):
    """Before any request: a timeout every request trips would read as an outage and open the shared breaker."""
    from recovery_ext import LLMResource

    with pytest.raises(ValueError) as refused:
        LLMResource(**{"api_key": "sk-never-shown-1234", **bad})
    assert [type(e["ctx"]["error"]) for e in refused.value.errors()] == [ConfigurationError]
    assert words in str(refused.value)
    assert "sk-never-shown-1234" not in str(refused.value)


def test_a_bad_base_url_is_shown_with_its_password_masked():
    from recovery_ext import LLMResource

    with pytest.raises(ValueError) as refused:
        LLMResource(base_url="http://user:hunter2-secret@llm.local:99999/v1")
    assert "hunter2-secret" not in str(refused.value) and "user:***@llm.local" in str(refused.value)


def test_llm_settings_in_range_are_kept():
    from recovery_ext import LLMResource

    llm = LLMResource(base_url="https://api.openai.com/v1", timeout=0.5, initial_delay=0, max_delay=0,
                      max_tokens=None, budget_margin_seconds=0)
    assert (llm.timeout, llm.initial_delay, llm.max_tokens) == (0.5, 0, None)
    assert LLMResource(base_url="").base_url == ""  # empty: the SDK's default


def test_an_llm_setting_from_run_config_is_refused_when_the_resource_is_initialized():
    from dagster import DagsterResourceFunctionError, build_resources

    from recovery_ext import LLMResource

    with pytest.raises(DagsterResourceFunctionError) as refused, build_resources(
            {"llm": LLMResource.configure_at_launch()}, resource_config={"llm": {"config": {"timeout": -1.0}}}):
        pass
    assert "timeout must be at least 0.1 s, got -1" in str(refused.value.__cause__)


def test_an_env_var_setting_is_checked_with_its_value_when_the_resource_is_initialized(monkeypatch):
    from dagster import DagsterResourceFunctionError, EnvVar, build_resources

    from recovery_ext import LLMResource

    llm = LLMResource(base_url=EnvVar("TEST_LLM_BASE_URL"), max_tokens=EnvVar.int("TEST_LLM_MAX_TOKENS"))
    monkeypatch.setenv("TEST_LLM_BASE_URL", "https://api.openai.com/v1")
    monkeypatch.setenv("TEST_LLM_MAX_TOKENS", "64")
    with build_resources({"llm": llm}) as resources:
        assert (resources.llm.base_url, resources.llm.max_tokens) == ("https://api.openai.com/v1", 64)
    monkeypatch.setenv("TEST_LLM_BASE_URL", "not a url")
    with pytest.raises(DagsterResourceFunctionError) as refused, build_resources({"llm": llm}):
        pass
    assert "base_url must be an http:// or https:// URL" in str(refused.value.__cause__)


@pytest.mark.parametrize("poll", [0, -1.0, float("nan"), float("inf")])
def test_the_demo_llm_resource_refuses_a_bad_batch_poll_interval(poll):
    from recovery_pipelines.llm import LLMResource

    with pytest.raises(ValueError, match="batch_poll_seconds must be a number of seconds from 0.1 to 86400"):
        LLMResource(batch=True, batch_poll_seconds=poll)
    assert LLMResource(batch=True, batch_poll_seconds=0.1).batch_poll_seconds == 0.1


def test_the_definitions_refuse_a_bad_price_in_one_line_naming_the_model(monkeypatch):
    import recovery_pipelines.assembly as assembly

    monkeypatch.setattr(assembly, "DEMO_PRICES", {"demo-llm": {"input": -1.0, "output": 0.6}})
    with pytest.raises(ConfigurationError) as refused:
        assembly.build_definitions()
    assert str(refused.value) == ("invalid LLMResource settings: the input price of model 'demo-llm' must be a number "
                                  "from 0 to 1e+06 per million tokens, got -1.0")


# -- a NUL byte in a provider's error text, stored as a pause reason, a breaker's error, a node's failure -------

def test_a_nul_byte_in_any_stored_message_is_kept_on_both_databases(store):
    from recovery_ext._store.models import ErrorInfo, NodeSpec

    own = store.pipelines.create_pipeline("job", [NodeSpec("n")], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "n")
    store.providers.set_waiting(own, 5, "Error code: 503 - upstream\x00busy", node="n")
    assert store.pipelines.get_pipeline(own.pipeline_id).waiting_reason == "Error code: 503 - upstream\ufffdbusy"
    store.providers.breaker_record_failure("http://llm.local/v1", "run-1", threshold=1, cooldown=lambda n: 5.0,
                                 error="Error code: 503 - upstream\x00busy")
    store.pipelines.fail_node(
        own, "n", ErrorInfo("Error code: 400 - bad\x00request", "validation", 400), permanent=True
    )
    failed = store.pipelines.get_pipeline(own.pipeline_id)
    assert failed.status == "failed" and "bad\ufffdrequest" in failed.error


def test_a_503_whose_error_message_holds_a_nul_byte_pauses_the_pipeline_on_both_databases(store, httpserver):
    from recovery_ext._store.models import NodeSpec

    own = store.pipelines.create_pipeline("job", [NodeSpec("n")], owner="run-1", origin_run_id="run-1")
    store.pipelines.start_node(own, "n")
    busy = Response('{"error":{"message":"upstream busy\\u0000"}}', status=503, content_type="application/json")
    seen = serve(httpserver, [busy, answer(200)])
    fake = FakeTime()
    build = store_guard(fake, store, own, pause_after=1, pause_initial=10, pause_max=60, budget_seconds=120)
    assert enricher(httpserver, guard_for=build).complete_json("glossary", {}) == {"ok": True}
    assert len(seen) == 2 and fake.slept == [10.0]
    [paused] = store.reports.recent_events(kinds=("pipeline_waiting",))
    assert "upstream busy\ufffd" in paused["payload"]["reason"]


# -- answers JSON accepts and a database does not: NUL, a lone surrogate, NaN (round four) ------------------------

def content_answer(content: str):
    body = {"id": "1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    return Response(json.dumps(body), content_type="application/json")


# What json.loads accepts in an answer, and what both databases keep in its place (docs/how-to/journal.md).
UNSTORABLE = {"nul": ('{"name": "a\\u0000b", "n\\u0000": 1}', {"name": "a\ufffdb", "n\ufffd": 1}),
              "surrogate": ('{"name": "a\\ud800b", "pair": "\\ud83d\\ude00"}',
                            {"name": "a\ufffdb", "pair": "\U0001f600"}),
              "nan": ('{"name": NaN, "all": [Infinity, -Infinity, 1.5]}', {"name": None, "all": [None, None, 1.5]})}


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_an_answer_json_accepts_is_stored_in_the_agreed_form_on_both_databases(kind, httpserver, db_url, store,
                                                                               monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    content, stored = UNSTORABLE[kind]
    seen = serve(httpserver, [content_answer(content), answer(200)])  # one item, then the glossary call
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(make_ledger_job(in_process_executor), instance=instance, raise_on_error=False,
                                    run_config={"ops": {"ask": {"config": {"items": 1}}}},
                                    resources={"recovery": recovery_resource(),
                                               "llm": llm_resource(httpserver.url_for("/v1"))})
    assert result.success and len(seen) == 2  # paid once, checkpointed, completed
    [pipeline] = store.reports.list_pipelines()
    assert store.pipelines.completed_items(pipeline.id, "ask") == {"t00": stored}


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_a_journaled_answer_replays_exactly_what_was_paid_for(kind):
    from recovery_ext._providers.journal import decode_answer, encode_answer

    paid = json.loads(UNSTORABLE[kind][0])
    text = encode_answer(paid)
    assert text is not None and text.isascii()  # both databases' text columns keep it as it is
    replayed = decode_answer(text)
    assert json.dumps(replayed) == json.dumps(paid)  # NaN included: journaled, so a re-execution never pays again


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_an_item_result_and_an_op_output_are_stored_in_the_agreed_form(kind, store):
    from recovery_ext._dagster.context import replayable_output

    content, stored = UNSTORABLE[kind]
    value = json.loads(content)
    assert replayable_output(value) == stored  # what the first run's downstream ops see is what a resume replays
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1", params={"p": value})
    store.pipelines.start_node(own, "a")
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k", value))
    store.pipelines.complete_node(own, "a", output=value)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k": stored}
    assert store.pipelines.get_pipeline(own.pipeline_id).params == {"p": stored}
    assert store.pipelines.get_node(own.pipeline_id, "a").output == stored


def test_the_agreed_form_changes_only_what_a_database_cannot_keep():
    from recovery_ext._conventions import agreed_json

    kept = {"text": "a backslash then u0000: \\u0000, \\ud800 and \\\\u0000", "emoji": "\U0001f600", "n": [1.5, -0.0],
            "deep": [[{"k": "\u00e9\u4e2d"}]]}
    assert agreed_json(kept) == kept
    assert agreed_json({"\x00": ["\udc00\ud800", "\ud800\udc00", float("-inf")]}) == {"\ufffd": ["\ufffd\ufffd",
                                                                                         "\U00010000", None]}
    with pytest.raises(TypeError):
        agreed_json({"not json": object()})


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_a_re_execution_replays_the_journaled_answer_and_completes_the_item_on_both_databases(kind, store):
    """Before: NUL and surrogate answers were journaled and failed every re-execution's checkpoint on PostgreSQL;
    a NaN answer was not journaled, so every re-execution paid again."""
    from dataclasses import replace

    from recovery_ext._providers.journal import decode_answer, encode_answer
    from recovery_ext._store.ledger import IN_FLIGHT

    content, stored = UNSTORABLE[kind]
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1", params={})
    store.pipelines.start_node(own, "a")
    paid = ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", outcome=IN_FLIGHT, pipeline_id=own.pipeline_id,
                        node_name="a", item_key="k", run_id=own.owner, epoch=own.epoch)
    assert store.providers.journal_begin(own, paid, call_key="fp#1") is None  # sent: nothing journaled yet
    store.providers.journal_answer(own, replace(paid, outcome="ok", tokens_in=3), call_key="fp#1",
                                   answer=encode_answer(json.loads(content)))
    new = store.pipelines.take_over(own.pipeline_id, "run-2", owner_dead=[own.owner])  # the step failed; re-execute
    store.pipelines.start_node(new, "a")
    again = replace(paid, id="second", run_id="run-2", epoch=new.epoch)
    hit = store.providers.journal_begin(new, again, call_key="fp#1")
    assert hit is not None  # replayed from the journal: not sent, not paid again
    replayed = decode_answer(hit.answer)
    assert json.dumps(replayed) == json.dumps(json.loads(content))
    store.pipelines.checkpoint_item(new, "a", ItemCheckpoint("k", replayed, calls=(hit.call,)))
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k": stored}
    assert len(store_rows.provider_calls(store, own.pipeline_id)) == 1  # one paid call, replayed once


# -- a call recorded for an item key the database cannot store ----------------------------------------------------

@recoverable_op
def records_for_an_odd_key(ctx):
    for item in ctx.items(["a", "b"]):
        if item.key == "a":  # for a key of the op's own making: text decoded from bytes that are not UTF-8
            ctx.record_call(ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=3),
                            item="scan-\udcff.png")
        ctx.record_call(ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=1))
        item.complete(item.key)
    return "done"


@job(executor_def=with_recovery(in_process_executor))
def odd_key_job():
    records_for_an_odd_key()


def test_a_call_recorded_for_an_item_key_no_database_stores_is_kept_and_the_op_completes(db_url, store):
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(odd_key_job, instance=instance,
                                    resources={"recovery": RecoveryResource(database_url=db_url)})
    assert result.success
    assert sorted((c.item_key, c.tokens_in) for c in store_rows.provider_calls(store)) == [
        ("a", 1), ("b", 1), ("scan-\ufffd.png", 3)]
