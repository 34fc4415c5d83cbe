"""A stand-in provider on 127.0.0.1 for items worked in parallel: it answers each POST with the item it names.

``POST /answer`` with ``{"item": KEY, ...}`` answers ``{"item": KEY, "answer": "answer-KEY", "usage": ...}``
after ``latency`` seconds. It counts what it was paid for, per item, and the most requests it ever
held at once (``peak``), and can fail chosen items: ``fail={KEY: [503, 503]}`` answers that item's
first two requests 503, then 200; ``fail={KEY: [400] * 100}`` fails it for good. A ``ThreadingHTTPServer``:
every request has its own thread, so ``latency`` overlaps as a provider's would.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # listen() backlog: 64 clients connecting at once are all accepted


class EchoProvider:
    def __init__(self, *, latency: float = 0.0, fail: dict[str, list[int]] | None = None) -> None:
        self.latency = latency
        self.fail = {k: list(v) for k, v in (fail or {}).items()}
        self.lock = threading.Lock()
        self.paid: Counter[str] = Counter()  # answered 200, per item
        self.refused: Counter[str] = Counter()  # answered an error, per item
        self.in_flight = 0
        self.peak = 0
        self.server: ThreadingHTTPServer | None = None
        self.url = ""
        self.started = threading.Event()  # set at the first request (a test kills mid-way)
        self.arrivals: list[tuple[float, str]] = []  # (time.monotonic(), item) of every request, as it arrived

    def start(self) -> str:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                item = str(json.loads(raw or b"{}").get("item"))
                with provider.lock:
                    provider.arrivals.append((time.monotonic(), item))
                    provider.in_flight += 1
                    provider.peak = max(provider.peak, provider.in_flight)
                    failures = provider.fail.get(item)
                    status = failures.pop(0) if failures else 200
                provider.started.set()
                try:
                    if provider.latency:
                        time.sleep(provider.latency)
                    with provider.lock:
                        (provider.paid if status == 200 else provider.refused)[item] += 1
                    body = ({"item": item, "answer": f"answer-{item}", "usage": {"prompt_tokens": 10,
                                                                             "completion_tokens": 5}}
                            if status == 200 else {"error": {"message": f"status {status}"}})
                    self._send(status, body)
                finally:
                    with provider.lock:
                        provider.in_flight -= 1

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client died mid-request: the answer was paid for all the same

            def log_message(self, *args):
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/answer"
        return self.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self) -> EchoProvider:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_this_process(latency: float) -> None:
    """``python echo_provider.py LATENCY``: serve until stdin closes, its URL on the first line of stdout (a bench
    runs the stand-in in a process of its own, as a real provider is: its threads then take no CPU time, and no
    GIL, from the process being measured)."""
    import sys

    with EchoProvider(latency=latency) as provider:
        print(provider.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    import sys

    serve_in_this_process(float(sys.argv[1]))
