"""A process under a spend cap, so a test can run several at once or kill one -9:
``python spend_worker.py DB_URL PIPELINE_ID EPOCH OWNER LLM_URL CAP MODE``.

``calls``: ask the stand-in LLM (through the provider guard and the ``openai`` SDK) until the cap pauses
this process; print what it asked. ``hold``: reserve one call's estimate, print ``held``, then wait to be
killed while it holds it."""

from __future__ import annotations

import json
import sys
import time

from recovery_ext import RecoveryStore, RetryPolicy
from recovery_ext._providers.guard import ProviderGuard
from recovery_ext._providers.spend import SpendCap
from recovery_ext._store.models import Ownership
from recovery_ext._store.models import SpendCaps
from recovery_pipelines.llm import OpenAICompatibleEnricher

MAX_TOKENS = 64


class AtTheCap(Exception):
    pass


def at_the_cap(seconds: float, reason: str, first: bool) -> None:
    raise AtTheCap(reason)


if __name__ == "__main__":
    url, pipeline_id, epoch, owner, llm_url, cap, mode = sys.argv[1:8]
    store = RecoveryStore(url)
    own = Ownership(int(pipeline_id), int(epoch), owner)
    spend = SpendCap(store, own, SpendCaps(pipeline_tokens=int(cap), poll_seconds=0.05), show_wait=at_the_cap)
    if mode == "hold":
        held = spend.acquire(1000)
        print(json.dumps({"held": held.ids}), flush=True)
        time.sleep(600)
    policy = RetryPolicy(initial_delay=0.05, max_delay=0.2)
    guard = ProviderGuard(llm_url, policy=policy, store=store, spend=spend)
    llm = OpenAICompatibleEnricher(llm_url, "m", "sk-test", 10, policy, guard, max_tokens=MAX_TOKENS)
    asked = 0
    estimate = 0
    try:
        while True:
            payload = {"table": f"{owner}-{asked}", "columns": []}
            estimate = llm.estimated_tokens(llm.messages("describe_entity", payload))
            llm.complete_json("describe_entity", payload)
            asked += 1
    except AtTheCap as exc:
        print(json.dumps({"asked": asked, "estimate": estimate, "reason": str(exc)}), flush=True)
