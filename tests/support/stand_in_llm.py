"""A stand-in OpenAI-compatible provider on 127.0.0.1 that counts what it is paid for.

Every request is logged with its arrival time, the item it asks about, the tokens it charges
(``usage``: prompt tokens from the prompt's length, completion tokens from the answer's) and,
when ``track_pids`` is on, the pid of the process that sent it (from /proc: the client socket's
inode). With a quota (``requests``/``tokens`` per ``window`` seconds, sliding) it answers 429 with
Retry-After to a request that would exceed it, as providers do; a refused request is logged and
charges nothing. ``fail_first=N`` answers the first N requests with ``fail_status`` (an outage that
ends), charging nothing either. ``host`` is the address it listens on (127.0.0.1, or the bridge address
of namespace hosts); each call keeps the client's address, and :meth:`in_progress` lists the requests
received whose answer has not been sent yet (a test cuts a client off mid-call).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from recovery_pipelines.llm import heuristic_answer


@dataclass(frozen=True)
class Call:
    at: float
    status: int
    item: str
    tokens_in: int
    tokens_out: int
    pid: int | None
    client: str | None = None


def usage_of(prompt_text: str, answer_text: str) -> tuple[int, int]:
    """What the stand-in charges: a token per 4 characters (about what tokenizers average)."""
    return len(prompt_text) // 4 + 1, len(answer_text) // 4 + 1


def _socket_pid(port: int, server_port: int) -> int | None:
    """The pid holding the client end (127.0.0.1:``port``) of a TCP connection to this server.

    An earlier connection from the same ephemeral port may linger in TIME_WAIT, with no owner
    (inode 0): only the live socket connected to ``server_port`` counts."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, remote = int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16)
                    if local == port and remote == server_port and parts[9] != "0":
                        inode = parts[9]
                        break
        except OSError:
            continue
        if inode:
            break
    if not inode:
        return None
    target = f"socket:[{inode}]"
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return int(pid)
        except OSError:
            continue
    return None


class StandInProvider:
    def __init__(self, *, latency: float = 0.0, requests: int | None = None, tokens: int | None = None,
                 window: float = 60.0, track_pids: bool = False, fail_first: int = 0,
                 fail_status: int = 503) -> None:
        self.latency, self.quota_requests, self.quota_tokens, self.window = latency, requests, tokens, window
        self.fail_first, self.fail_status = fail_first, fail_status
        self.track_pids = track_pids
        self.calls: list[Call] = []
        self._answering: list[Call] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    # -- what it counted ---------------------------------------------------------------------------

    def answered(self) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.status == 200]

    def refused(self) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.status == 429]

    def failed(self) -> list[Call]:
        """Every request it did not answer (refused by the quota or failed on purpose)."""
        with self.lock:
            return [c for c in self.calls if c.status != 200]

    def in_progress(self) -> list[Call]:
        """Requests received and charged whose answer is not sent yet (the stand-in's latency)."""
        with self.lock:
            return list(self._answering)

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()

    def totals(self) -> dict[str, int]:
        with self.lock:
            return {"calls": len(self.calls), "tokens_in": sum(c.tokens_in for c in self.calls),
                    "tokens_out": sum(c.tokens_out for c in self.calls)}

    def max_in_window(self) -> tuple[int, int]:
        """The most requests and tokens it answered within any ``window`` seconds."""
        answered = sorted(self.answered(), key=lambda c: c.at)
        most_requests = most_tokens = 0
        for i, first in enumerate(answered):
            inside = [c for c in answered[i:] if c.at < first.at + self.window]
            most_requests = max(most_requests, len(inside))
            most_tokens = max(most_tokens, sum(c.tokens_in + c.tokens_out for c in inside))
        return most_requests, most_tokens

    # -- serving -----------------------------------------------------------------------------------

    def _admit(self, now: float, tokens: int) -> float | None:
        """None when the request fits the quota (and it is counted), else the seconds until it would."""
        recent = [c for c in self.calls if c.status == 200 and c.at > now - self.window]
        over_requests = self.quota_requests is not None and len(recent) + 1 > self.quota_requests
        over_tokens = self.quota_tokens is not None and \
            sum(c.tokens_in + c.tokens_out for c in recent) + tokens > self.quota_tokens
        if not (over_requests or over_tokens):
            return None
        return max(0.05, recent[0].at + self.window - now) if recent else self.window

    def start(self, host: str = "127.0.0.1") -> str:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart

            def do_POST(self):  # noqa: N802 - http.server's naming
                now = time.time()
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw or b"{}")
                prompt_text = body["messages"][-1]["content"]
                prompt = json.loads(prompt_text)
                item = str(prompt["input"].get("table") or prompt["input"].get("term") or "")
                answer = json.dumps(heuristic_answer(prompt["task"], prompt["input"]))
                tokens_in, tokens_out = usage_of(prompt_text, answer)
                pid = (_socket_pid(self.client_address[1], self.server.server_address[1])
                       if provider.track_pids else None)
                with provider.lock:
                    if len(provider.calls) < provider.fail_first:
                        provider.calls.append(Call(now, provider.fail_status, item, 0, 0, pid))
                        failing = True
                    else:
                        failing = False
                if failing:
                    self._send(provider.fail_status, {"error": {"message": "the service is down", "type": "server"}})
                    return
                with provider.lock:
                    wait = provider._admit(now, tokens_in + tokens_out)
                    call = Call(now, 200 if wait is None else 429, item, tokens_in if wait is None else 0,
                                tokens_out if wait is None else 0, pid, self.client_address[0])
                    provider.calls.append(call)
                    if wait is None:
                        provider._answering.append(call)
                if wait is not None:
                    self._send(429, {"error": {"message": "rate limit exceeded", "type": "requests"}},
                               {"Retry-After": f"{wait:.3f}"})
                    return
                try:
                    if provider.latency:
                        time.sleep(provider.latency)
                    self._answer(now, body, answer, tokens_in, tokens_out)
                finally:
                    with provider.lock:
                        provider._answering.remove(call)

            def _answer(self, now, body, answer, tokens_in, tokens_out):
                self._send(200, {"id": "c", "object": "chat.completion", "created": int(now),
                                 "model": body.get("model", "m"),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": answer}}],
                                 "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                                           "total_tokens": tokens_in + tokens_out}})

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client was killed mid-request: the answer was paid for all the same

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://{host}:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self) -> StandInProvider:
        self.url = self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
