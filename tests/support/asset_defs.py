"""Recoverable assets and ops with Dagster-native signatures, for tests/dagster/test_assets.py (in-process
and through ``execute_job`` on the implicit asset job of ``defs``)."""

from __future__ import annotations

from dagster import (
    AssetOut,
    BackfillPolicy,
    Config,
    ConfigurableResource,
    Definitions,
    EnvVar,
    MaterializeResult,
    Output,
    RetryPolicy,
    StaticPartitionsDefinition,
    define_asset_job,
    in_process_executor,
)

from recovery_ext import (
    NodeContext,
    RecoveryResource,
    recoverable_asset,
    recoverable_job,
    recoverable_multi_asset,
    recoverable_op,
    with_recovery,
)

SEEN: list[dict] = []  # what the bodies received (in-process runs only)


class Greeting(Config):
    word: str = "hello"
    items: int = 3


class Counter(ConfigurableResource):
    start: int = 100


class Failing(ConfigurableResource):
    """Raises with the status it is configured with (400: permanent, 503: transient)."""

    status: int = 400

    def call(self) -> None:
        import httpx

        request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat")
        raise httpx.HTTPStatusError(f"HTTP {self.status}", request=request,
                                    response=httpx.Response(self.status, request=request))


@recoverable_asset
def words(ctx: NodeContext, config: Greeting, counter: Counter) -> list:
    SEEN.append({"asset": "words", "config": config, "counter": counter})
    for item in ctx.items(f"{config.word}-{i}" for i in range(config.items)):
        SEEN.append({"item": item.key})
        item.complete(counter.start)
    return sorted(ctx.completed_items())


class ReportConfig(Config):
    fail: bool = False


@recoverable_asset
def word_report(ctx: NodeContext, words: list, config: ReportConfig) -> MaterializeResult:
    if config.fail:
        raise ValueError("report refused: a permanent error")
    return MaterializeResult(metadata={"words_seen": len(words), "first": words[0]})


@recoverable_multi_asset(outs={"left": AssetOut(), "right": AssetOut()})
def pair(ctx: NodeContext, words: list):
    for item in ctx.items(["l", "r"]):
        item.complete()
    return Output(words[:1], output_name="left", metadata={"side": "left"}), words[1:]


@recoverable_asset(retry_policy=RetryPolicy(max_retries=3, delay=0.01))
def flaky(ctx: NodeContext, failing: Failing) -> int:
    SEEN.append({"asset": "flaky", "retry": ctx.context.retry_number})
    failing.call()
    return 1


@recoverable_op(retry_policy=RetryPolicy(max_retries=2, delay=0.01))
def typed_op(ctx: NodeContext, config: Greeting, counter: Counter) -> Output:
    SEEN.append({"op": "typed_op", "config": config, "counter": counter, "retry": ctx.context.retry_number})
    return Output({"word": config.word, "start": counter.start}, metadata={"custom": "yes"})


@recoverable_op
def doubled(ctx: NodeContext, value: dict) -> int:
    return value["start"] * 2


@recoverable_job(executor_def=in_process_executor)
def typed_job():
    doubled(typed_op())


def recovery_resource() -> RecoveryResource:
    return RecoveryResource(database_url=EnvVar("RECOVERY_DATABASE_URL"), heartbeat_interval=0.5,
                            heartbeat_timeout=5.0, max_retries=1, retry_initial_delay=0.01, retry_max_delay=0.02)


@recoverable_asset(partitions_def=StaticPartitionsDefinition(["a", "b", "c"]),
                   backfill_policy=BackfillPolicy.single_run())
def ranged(ctx: NodeContext) -> MaterializeResult:
    keys = ctx.context.partition_keys
    for item in ctx.items(keys):
        item.complete()
    return MaterializeResult(metadata={"keys": ",".join(keys)})


words_job = define_asset_job("words_job", selection=[words, word_report, pair])
flaky_job = define_asset_job("flaky_job", selection=[flaky])
ranged_job = define_asset_job("ranged_job", selection=[ranged])


def definitions(**resources) -> Definitions:
    return Definitions(assets=[words, word_report, pair, flaky, ranged],
                       jobs=[words_job, flaky_job, ranged_job, typed_job],
                       executor=with_recovery(in_process_executor),
                       resources={"recovery": recovery_resource(), "counter": Counter(start=7),
                                  "failing": Failing(), **resources})


defs = definitions()  # as a code location loads it: the daemon's asset backfills run its implicit asset job
