"""A token-per-window limit enforced by a stand-in provider, and LLMResource's shared budget set to it: how close
the throughput comes to the limit, and how many 429s the provider sent.

    python -m bench.tpm_bench [--dialect sqlite|postgres] [--tokens 3000] [--window 5] [--tasks 64] [--requests 600]
                              [--budget-tokens N]

One process sends ``--requests`` chat completions from ``--tasks`` asyncio tasks through the async client, inside
a recoverable op; the stand-in (tests/support/sdk_stand_in.py) refuses with a 429 what would exceed ``--tokens``
per ``--window`` seconds. Prints the tokens the stand-in answered per window against the limit, from the first
answer to the last, and the statuses it sent. ``--budget-tokens``: the shared budget's limit when it is not the
provider's (default: the same): set above it, as when others share the key or the limit was set too high, the
provider refuses with 429s all along, and the budget's back-off is what paces the calls. Nothing is asserted."""

from __future__ import annotations

import argparse
import contextlib
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from dagster import DagsterInstance, in_process_executor  # noqa: E402
from sdk_stand_in import SdkStandIn  # noqa: E402

from recovery_ext import (LLMResource, NodeContext, RecoveryResource, execute_in_process,  # noqa: E402
                          recoverable_job, recoverable_op)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dialect", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--budget-tokens", type=int, default=None,
                        help="the shared budget's tokens per window (default: the provider's --tokens)")
    args = parser.parse_args()
    with contextlib.ExitStack() as cleanup:
        home = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tpm-bench-"))
        sqlite = args.dialect == "sqlite"
        run(args, f"sqlite:///{home}/app.db" if sqlite else cleanup.enter_context(_scratch_postgres()))


@contextlib.contextmanager
def _scratch_postgres() -> Iterator[str]:
    """A database of its own, dropped when the bench ends (its pool's connections with it)."""
    import psycopg

    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    name = f"tpm_bench_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run(args: argparse.Namespace, db_url: str) -> None:
    server = SdkStandIn(tokens=args.tokens, window=args.window, latency=0.05)
    url = server.start()

    @recoverable_op(required_resource_keys={"llm"})
    def send_all(ctx: NodeContext) -> int:
        llm = ctx.context.resources.llm

        async def everything() -> int:
            client = llm.get_async_client()
            queue: asyncio.Queue[int] = asyncio.Queue()
            for n in range(args.requests):
                queue.put_nowait(n)

            async def worker() -> None:
                while not queue.empty():
                    n = queue.get_nowait()
                    await client.chat.completions.create(
                        model="m", max_tokens=12, messages=[{"role": "user", "content": f"question {n}"}])

            await asyncio.gather(*(worker() for _ in range(args.tasks)))
            return args.requests

        return asyncio.run(everything())

    @recoverable_job(name="tpm_bench", executor_def=in_process_executor)
    def tpm_bench():
        send_all()

    llm = LLMResource(base_url=f"{url}/v1", model="m", api_key="sk-bench", timeout=60, initial_delay=0.05,
                      max_delay=5.0, tokens_per_minute=args.budget_tokens or args.tokens,
                      budget_window_seconds=args.window, max_tokens=12)
    try:
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(tpm_bench, instance=instance, resources={
                "recovery": RecoveryResource(database_url=db_url), "llm": llm})
    finally:
        server.stop()
    answered = sorted(server.answered(), key=lambda r: r.at)
    span = answered[-1].at - answered[0].at
    tokens = sum(r.tokens_in + r.tokens_out for r in answered)
    statuses = server.statuses()
    # the first window is a burst the limit allows at once: the rate over the rest is what the limit governs
    rate = (tokens - sum(r.tokens_in + r.tokens_out for r in answered if r.at < answered[0].at + args.window)) \
        / max(span - args.window, 1e-9) * args.window
    print(f"dialect={args.dialect} success={result.success} requests={len(answered)} tokens={tokens} "
          f"span={span:.1f}s limit={args.tokens}/{args.window:g}s budget={args.budget_tokens or args.tokens}")
    print(f"throughput after the first window: {rate:.0f} tokens per window = {rate / args.tokens:.2f}x the limit; "
          f"over the whole run {tokens / span * args.window:.0f} per window")
    print(f"most tokens in any window: {server.max_tokens_in_window()}; 429s: {statuses.count(429)}; "
          f"statuses sent: {sorted(set(statuses))}")


if __name__ == "__main__":
    main()
