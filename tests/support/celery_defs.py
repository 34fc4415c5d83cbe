"""A code location whose job runs on Dagster's Celery executor (wrapped by ``with_recovery``).

Three chained item nodes; every business-logic call is recorded with the host (``RX_HOST``) and
process that made it, in ``celery_calls`` beside the application tables, so tests see which
worker host did which item and whether anything was done twice. Short liveness settings come
from the environment (``CELERY_E2E_*``).

``celery_llm_job``: one item node that asks the shipped LLM resource (journaled by default) two
questions per item, at the stand-in provider of ``CELERY_E2E_LLM_URL`` (tests/e2e/test_celery_ledger.py).
"""

from __future__ import annotations

import os
import time

from dagster import Definitions, Field, job, multiprocess_executor
from sqlalchemy import Column, Float, Integer, MetaData, Table, Text, insert

from recovery_ext import recoverable_celery_executor
from recovery_ext import TAG_RESUME_NUMBER, RecoveryResource, make_orphan_sensor, recoverable_op, with_recovery
from recovery_pipelines.llm import LLMResource

calls_metadata = MetaData()
calls = Table(
    "celery_calls", calls_metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Text), Column("node", Text), Column("item", Text), Column("host", Text),
    Column("pid", Integer), Column("at", Float),
)

NODE_CONFIG = {
    "items": Field(int, default_value=4),
    "item_seconds": Field(float, default_value=0.3),
}


def record_call(store, run_id: str, node: str, item: str) -> None:
    calls_metadata.create_all(store.engine, checkfirst=True)
    with store.engine.begin() as conn:
        conn.execute(insert(calls).values(run_id=run_id, node=node, item=item, host=os.environ.get("RX_HOST", "?"),
                                          pid=os.getpid(), at=time.time()))


def make_item_node(name: str, *, first: bool = False):
    def body(ctx, upstream=None):
        cfg = ctx.op_config
        run_id = ctx.context.run_id
        for item in ctx.items(f"{name}-{i}" for i in range(cfg["items"])):
            record_call(ctx._store, run_id, name, item.key)
            time.sleep(cfg["item_seconds"])
            item.complete({"item": item.key, "run": run_id, "host": os.environ.get("RX_HOST", "?")})
        return {
            "node": name,
            "items": sorted(ctx.completed_items()),
            "resumed": TAG_RESUME_NUMBER in ctx.context.run.tags,
        }

    body.__name__ = name
    return recoverable_op(name=name, config_schema=NODE_CONFIG, ins={} if first else None)(body)


n1 = make_item_node("n1", first=True)
n2 = make_item_node("n2")
n3 = make_item_node("n3")


@recoverable_op(required_resource_keys={"llm"}, config_schema={"items": Field(int, default_value=5)})
def ask_llm(ctx) -> dict:
    llm = ctx.context.resources.llm.enricher(ctx)
    for item in ctx.items(f"t{i:02d}" for i in range(ctx.op_config["items"])):
        record_call(ctx._store, ctx.context.run_id, "ask_llm", item.key)
        entity = llm.complete_json("describe_entity", {"table": item.key, "columns": []})
        columns = llm.complete_json("describe_columns", {"table": item.key,
                                                         "columns": [{"name": "id", "primary_key": True}]})
        item.complete({"entity": entity, "columns": columns})
    return {"items": sorted(ctx.completed_items())}


@job(name="celery_llm_job", executor_def=recoverable_celery_executor())
def celery_llm_job():
    ask_llm()


def _graph():
    n3(n2(n1()))


celery_items_job = job(name="celery_items_job", executor_def=recoverable_celery_executor())(_graph)
# the same job on the multiprocess executor, for the bench's side-by-side (run under the default run
# launcher there: under the CeleryRunLauncher a run worker is a Celery pool process)
mp_items_job = job(name="mp_items_job", executor_def=with_recovery(multiprocess_executor))(_graph)


def _resource() -> RecoveryResource:
    return RecoveryResource(
        database_url=os.environ.get("RECOVERY_DATABASE_URL"),
        heartbeat_interval=float(os.environ.get("CELERY_E2E_HEARTBEAT_INTERVAL", "1")),
        heartbeat_timeout=float(os.environ.get("CELERY_E2E_HEARTBEAT_TIMEOUT", "5")),
        max_resumes=int(os.environ.get("CELERY_E2E_MAX_RESUMES", "3")),
        launch_grace_seconds=float(os.environ.get("CELERY_E2E_LAUNCH_GRACE", "60")),
        max_retries=3,
        retry_initial_delay=0.01,
        retry_max_delay=0.05,
    )


def _llm() -> LLMResource:
    """The stand-in provider; a timeout longer than any cut, so an answer held up by a partition arrives."""
    return LLMResource(base_url=os.environ.get("CELERY_E2E_LLM_URL"), model="m", api_key="sk-test", timeout=300,
                       initial_delay=0.05, max_delay=1.0, max_tokens=256,
                       prices={"m": {"input": 1.5, "output": 6.0}})


jobs = [celery_items_job, mp_items_job, celery_llm_job]
sensor_interval = int(os.environ.get("CELERY_E2E_SENSOR_INTERVAL", "1"))
defs = Definitions(jobs=jobs, sensors=[make_orphan_sensor(jobs, minimum_interval_seconds=sensor_interval)],
                   resources={"recovery": _resource(), "llm": _llm()})
