"""Items in parallel: a recoverable op (``ctx.map`` threads, ``ctx.amap`` tasks; every call journaled, ledgered
and checkpointed) against a plain Dagster op making the same calls at the same concurrency with no recovery.

Each item is one POST to a local stand-in answering after ``RX_CONC_LATENCY`` s (0.2), in a process of its own
(``RX_CONC_PROVIDER=thread``: in the bench's process, as before 2026-11-29). The plain op is the
limit: the figure to read is ``ratio`` = recoverable items/s over plain items/s, per database, mode and
concurrency. The two ops run in turn (plain, recoverable, plain, ...), ``RX_CONC_REPEAT`` times each, on
a fresh database each; the medians are printed. With asyncio the plain op runs two ways, one task per key
sharing one client (``gather``) and one task and client per unit of concurrency (``workers``), and the
faster median is the limit: a shared client's pool loses time when many requests start in one loop turn,
and by how much varies from one machine, and one boot, to the next.

    python -m bench.concurrency_bench                      # 1,000 items at 8, 32 and 64; 100 at 1
    RX_CONC_ITEMS=200 RX_CONC_LEVELS=64 python -m bench.concurrency_bench
    RX_CONC_MEMORY=100000 python -m bench.concurrency_bench  # peak memory, 100,000 keys at 64 beside 1,000 (SQLite)
    RX_CONC_VERBOSE=1 ...      # each run's rate and process CPU per item
    RX_CONC_POOL_STATS=1 ...   # and, with asyncio, what httpx's connection pool costs each op

Needs PostgreSQL at 127.0.0.1:5432 (``RECOVERY_TEST_PG``) for the PostgreSQL rows.
"""



import asyncio
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from dagster import Config, OpExecutionContext, in_process_executor, job, op

from recovery_ext import NodeContext, RecoveryResource, ajournaled_call, journaled_call
from recovery_ext import recoverable_job, recoverable_op
from recovery_ext.testing import execute_in_process

ADMIN = os.environ.get("RECOVERY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
LATENCY = float(os.environ.get("RX_CONC_LATENCY", "0.2"))
ITEMS = int(os.environ.get("RX_CONC_ITEMS", "1000"))
ITEMS_AT_ONE = int(os.environ.get("RX_CONC_ITEMS_AT_1", "100"))
LEVELS = [int(x) for x in os.environ.get("RX_CONC_LEVELS", "1,8,32,64").split(",")]
REPEAT = int(os.environ.get("RX_CONC_REPEAT", "1"))
DATABASES = os.environ.get("RX_CONC_DATABASES", "sqlite,postgresql").split(",")
MODES = os.environ.get("RX_CONC_MODES", "threads,asyncio").split(",")
SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"


class Load(Config):
    url: str
    items: int
    concurrency: int
    mode: str
    call: bool = True  # False: the item function returns at once (what the map and its checkpoints cost alone)
    # asyncio's plain op, two ways: "gather" (one task per key behind a semaphore, one shared client: what a user
    # writes first) and "workers" (one task and one client per unit of concurrency): a shared client's pool can
    # hand one idle connection to many requests that start in the same loop turn, and all but one then retry.
    plain_style: str = "gather"


# Wall seconds of the last op body (the calls, and for the recoverable op every checkpoint): what is compared,
# without the run's own start-up, the same for both.
BODY_SECONDS: list[float] = []


def _keys(n: int) -> list[str]:
    return [f"doc-{i:06d}" for i in range(n)]


_limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
_client: httpx.Client | None = None
_aclient: httpx.AsyncClient | None = None


def _sync_client() -> httpx.Client:
    global _client
    if _client is None:
        _client = httpx.Client(limits=_limits, timeout=60)
    return _client


def _post(url: str, key: str) -> dict:
    return _sync_client().post(url, json={"item": key}).raise_for_status().json()


async def _apost(client: httpx.AsyncClient, url: str, key: str) -> dict:
    return (await client.post(url, json={"item": key})).raise_for_status().json()


# -- the limit: a plain op, no recovery ---------------------------------------------------------------------

@op
def plain(context: OpExecutionContext, config: Load) -> int:
    started = time.perf_counter()
    try:
        return _plain(config)
    finally:
        BODY_SECONDS.append(time.perf_counter() - started)


def _plain(config: Load) -> int:
    keys = _keys(config.items)
    if config.mode == "threads":
        with ThreadPoolExecutor(config.concurrency) as pool:
            return len(list(pool.map(lambda k: _post(config.url, k)["answer"], keys)))

    async def main() -> int:
        gate = asyncio.Semaphore(config.concurrency)
        async with httpx.AsyncClient(limits=_limits, timeout=60) as client:
            async def one(key: str) -> str:
                async with gate:
                    return (await _apost(client, config.url, key))["answer"]
            return len(await asyncio.gather(*(one(k) for k in keys)))

    async def workers() -> int:
        todo = iter(keys)

        async def worker() -> int:
            answered = 0
            async with httpx.AsyncClient(limits=_limits, timeout=60) as client:
                for key in todo:  # the tasks share one iterator: each key is posted once
                    answered += bool((await _apost(client, config.url, key))["answer"])
            return answered
        return sum(await asyncio.gather(*(worker() for _ in range(config.concurrency))))

    return asyncio.run(workers() if config.plain_style == "workers" else main())


@job(executor_def=in_process_executor)
def plain_job():
    plain()


# -- recoverable: journaled, ledgered, checkpointed ----------------------------------------------------------

@recoverable_op
async def recoverable(ctx: NodeContext, config: Load) -> int:
    started = time.perf_counter()
    try:
        return await _recoverable(ctx, config)
    finally:
        BODY_SECONDS.append(time.perf_counter() - started)


async def _recoverable(ctx: NodeContext, config: Load) -> int:
    keys = _keys(config.items)
    if not config.call:
        async def instant(item) -> str:
            return item.key

        return (await ctx.amap(instant, keys, concurrency=config.concurrency)).done
    if config.mode == "threads":
        def one(item) -> str:
            body = {"item": item.key}
            return journaled_call(lambda: _post(config.url, item.key), endpoint=config.url, request=body)["answer"]

        return ctx.map(one, keys, concurrency=config.concurrency).done

    async with httpx.AsyncClient(limits=_limits, timeout=60) as client:
        async def aone(item) -> str:
            body = {"item": item.key}
            answer = await ajournaled_call(lambda: _apost(client, config.url, item.key), endpoint=config.url,
                                           request=body)
            return answer["answer"]

        return (await ctx.amap(aone, keys, concurrency=config.concurrency)).done


@recoverable_job(executor_def=in_process_executor)
def recoverable_bench_job():
    recoverable()


def _database(kind: str) -> tuple:
    if kind == "sqlite":
        folder = tempfile.mkdtemp(prefix="rx-conc-")
        return f"sqlite:///{folder}/rx.db", lambda: None
    import psycopg

    name = f"rx_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return ADMIN.rsplit("/", 1)[0] + f"/{name}", drop


# RX_CONC_POOL_STATS=1: what httpx's async connection pool costs each op. httpcore 1.0.9 walks every pooled
# connection, and for each idle one all of them again, at every request and release (encode/httpcore#1035), so its
# CPU grows with the connections idle at that moment: the figure shows how much of an op's CPU is that pass.
POOL_STATS = {"passes": 0, "seconds": 0.0, "idle": 0}


def _count_pool_passes() -> None:
    from httpcore._async.connection_pool import AsyncConnectionPool

    assign = AsyncConnectionPool._assign_requests_to_connections

    def counted(pool):
        POOL_STATS["passes"] += 1
        POOL_STATS["idle"] += sum(1 for c in pool._connections if c.is_idle())
        started = time.perf_counter()
        try:
            return assign(pool)
        finally:
            POOL_STATS["seconds"] += time.perf_counter() - started

    AsyncConnectionPool._assign_requests_to_connections = counted


def _timed(job_def, op_name: str, config: dict, resources: dict | None) -> float:
    run_config = {"ops": {op_name: {"config": config}}}
    POOL_STATS.update(passes=0, seconds=0.0, idle=0)
    cpu = time.process_time()
    if resources is not None:
        result = execute_in_process(job_def, run_config=run_config, resources=resources)
    else:
        result = job_def.execute_in_process(run_config=run_config)
    assert result.success
    assert result.output_for_node(op_name) == config["items"]
    cpu = time.process_time() - cpu
    items = config["items"]
    line = f"  {op_name:11} {items / BODY_SECONDS[-1]:6.1f}/s, process CPU {1000 * cpu / items:.2f} ms/item"
    if POOL_STATS["passes"]:
        line += (f"; httpx pool passes {POOL_STATS['passes']}, {1000 * POOL_STATS['seconds'] / items:.2f} "
                 f"ms/item, {POOL_STATS['idle'] / POOL_STATS['passes']:.1f} connections idle at a pass")
    if os.environ.get("RX_CONC_VERBOSE") or POOL_STATS["passes"]:
        print(line, flush=True)
    return BODY_SECONDS[-1]


def _bench(url: str) -> list[tuple]:
    rows = []
    for kind in DATABASES:
        for mode in MODES:
            for level in LEVELS:
                items = ITEMS_AT_ONE if level == 1 else ITEMS
                config = {"url": url, "items": items, "concurrency": level, "mode": mode}
                plain_s, workers_s, recov_s = [], [], []
                for _ in range(REPEAT):
                    plain_s.append(_timed(plain_job, "plain", config, None))
                    if mode == "asyncio":
                        workers_s.append(_timed(plain_job, "plain", {**config, "plain_style": "workers"}, None))
                    db_url, drop = _database(kind)
                    try:
                        recov_s.append(_timed(recoverable_bench_job, "recoverable", config,
                                              {"recovery": RecoveryResource(database_url=db_url)}))
                    finally:
                        drop()
                p, r = statistics.median(plain_s), statistics.median(recov_s)
                both = ""
                if workers_s:  # the limit is the faster of asyncio's two plain ops
                    w = statistics.median(workers_s)
                    both = f"  (plain gather {items / p:.1f}/s, workers {items / w:.1f}/s)"
                    p = min(p, w)
                rows.append((kind, mode, level, items, items / p, items / r, p / r))
                print(f"{kind:10} {mode:8} c={level:<3} items={items:<5} plain {items / p:7.1f}/s  "
                      f"recoverable {items / r:7.1f}/s  ratio {p / r:.2f}{both}", flush=True)
    return rows


def _memory(url: str, keys: int) -> None:
    """Peak memory of one process working ``keys`` items at 64 (asyncio, SQLite), beside the same run of 1,000."""
    for n in (1000, keys):
        code = (f"import bench.concurrency_bench as b; b._memory_child({url!r}, {n})")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[1])
        print(out.stdout.strip(), flush=True)


def _memory_child(url: str, n: int) -> None:
    db_url, drop = _database("sqlite")
    config = {"url": url, "items": n, "concurrency": 64, "mode": "asyncio", "call": False}
    seconds = _timed(recoverable_bench_job, "recoverable", config, {"recovery": RecoveryResource(database_url=db_url)})
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"memory: {n} keys at 64 (asyncio tasks, SQLite, items that return at once): peak RSS {peak_mib:.0f} MiB, "
          f"{n / seconds:.0f} items/s")
    drop()


@contextlib.contextmanager
def _stand_in() -> Iterator[str]:
    """The stand-in's URL: in a process of its own (the default, as a provider is never in the worker's process:
    its request threads would take CPU time and the GIL from both ops), or with ``RX_CONC_PROVIDER=thread`` in
    this one (how the figures before 2026-11-29 were taken)."""
    sys.path.insert(0, str(SUPPORT))
    if os.environ.get("RX_CONC_PROVIDER", "process") == "thread":
        from echo_provider import EchoProvider

        with EchoProvider(latency=LATENCY) as provider:
            yield provider.url
        return
    child = subprocess.Popen([sys.executable, str(SUPPORT / "echo_provider.py"), str(LATENCY)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the stand-in provider did not start (it printed {url!r})")
        yield url
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    if os.environ.get("RX_CONC_POOL_STATS"):
        _count_pool_passes()
    with _stand_in() as url:
        memory = os.environ.get("RX_CONC_MEMORY")
        if memory:
            _memory(url, int(memory))
            return
        where = os.environ.get("RX_CONC_PROVIDER", "process")
        print(f"{ITEMS} items (at concurrency 1: {ITEMS_AT_ONE}), each a {LATENCY * 1000:.0f} ms call to a stand-in "
              f"in {'this process' if where == 'thread' else 'a process of its own'}; {REPEAT} run(s) each, medians",
              flush=True)
        _bench(url)


if __name__ == "__main__":
    main()
