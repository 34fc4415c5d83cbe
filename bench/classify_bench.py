"""Classification cost per exception, in microseconds (issue: retry classifier benchmark).

Targets: a typed classification under 20 us, one decided by the message's words under 50 us. The
cases run twice: with only httpx imported, then with every library that has a family imported
(botocore, grpc, google-api-core, redis, PyMySQL, asyncpg, aiohttp, urllib3, websockets, anthropic,
kombu, smtplib, dagster, pika, ftplib, pymongo, nats), so each family's judges are active.

Run: .venv/bin/python -m bench.classify_bench
"""

from __future__ import annotations

import importlib
import statistics
import time
import timeit

import httpx

from recovery_ext._classify.classifier import classify

FAMILY_LIBRARIES = ("botocore.exceptions", "grpc", "google.api_core.exceptions", "redis", "pymysql", "asyncpg",
                    "aiohttp", "urllib3", "websockets", "anthropic", "kombu", "smtplib", "dagster", "sqlalchemy",
                    "pika", "ftplib", "pymongo", "nats.errors")


def make_cases():
    request = httpx.Request("POST", "https://api.example/v1/chat/completions")
    typed = httpx.HTTPStatusError("boom", request=request, response=httpx.Response(503, request=request))
    pattern = RuntimeError("upstream answered: 503 Service Unavailable, try later")
    unknown = ValueError("processed 500 rows; timeout must be positive")
    try:
        try:
            raise ConnectionResetError(104, "connection reset by peer")
        except OSError as inner:
            raise RuntimeError("while calling the model") from inner
    except RuntimeError as chained:
        deep = chained
    return {"typed (httpx 503)": typed, "pattern (message only)": pattern, "unrecognised (all rules tried)": unknown,
            "chained (errno in cause)": deep}


def family_cases():
    from botocore.exceptions import ClientError

    throttled = ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"},
                             "ResponseMetadata": {"HTTPStatusCode": 400}}, "InvokeModel")
    import redis

    return {"typed (botocore throttling)": throttled, "typed (redis connection)": redis.ConnectionError("reset"),
            "group (2 timeouts)": ExceptionGroup("g", [TimeoutError("a"), TimeoutError("b")])}


def _per_call_us(exc: BaseException, timer) -> list[float]:
    return sorted(t / 2000 * 1e6 for t in timeit.repeat(lambda: classify(exc), number=2000, repeat=15, timer=timer))


def report(cases) -> None:
    for name, exc in cases.items():
        assert classify(exc) is not None
        wall, cpu = _per_call_us(exc, time.perf_counter), _per_call_us(exc, time.thread_time)
        print(f"{name:34} {statistics.median(wall):10.2f} {wall[int(len(wall) * 0.95) - 1]:10.2f}"
              f" {statistics.median(cpu):10.2f}")


def main() -> None:
    # cpu us: this thread's CPU time per call, which time taken by other processes on a busy machine does not inflate
    print(f"{'case':34} {'median us':>10} {'p95 us':>10} {'cpu us':>10}")
    print("-- only httpx imported")
    report(make_cases())
    loaded = []
    for module in FAMILY_LIBRARIES:
        try:
            importlib.import_module(module)
            loaded.append(module.split(".")[0])
        except ImportError:
            pass
    print(f"-- with {len(loaded)} family libraries imported ({', '.join(loaded)})")
    report(make_cases() | family_cases())


if __name__ == "__main__":
    main()
