"""Classification cost per exception, in microseconds (issue: retry classifier benchmark).

Run: .venv/bin/python -m bench.classify_bench
"""

from __future__ import annotations

import statistics
import timeit

import httpx

from recovery_ext._classify.classifier import classify


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


def main() -> None:
    print(f"{'case':34} {'median us':>10} {'p95 us':>10}")
    for name, exc in make_cases().items():
        assert classify(exc) is not None
        runs = [t / 2000 * 1e6 for t in timeit.repeat(lambda: classify(exc), number=2000, repeat=15)]
        runs.sort()
        print(f"{name:34} {statistics.median(runs):10.2f} {runs[int(len(runs) * 0.95) - 1]:10.2f}")


if __name__ == "__main__":
    main()
