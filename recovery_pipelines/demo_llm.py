"""A tiny OpenAI-compatible chat-completions server on 127.0.0.1 for the crash demo.

It answers with the heuristic enricher after a fixed latency, so an LLM node takes as long
as it would against a real endpoint, without a network or an API key.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from recovery_pipelines.llm import heuristic_answer


def tokens(text: str) -> int:
    """About four characters a token, as OpenAI's tokenizers average on English: the stand-in's usage."""
    return max(1, -(-len(text) // 4))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # listen()'s backlog: http.server's default of 5 refused connections (the client's APIConnectionError)
    # once a few tens of requests arrived at once, as an async op's 32 or 64 do
    request_queue_size = 1024


def serve(latency: float = 0.7, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        # http.server's HTTP/1.0, a connection per answer, is kept on purpose: kept HTTP/1.1 connections answered
        # 64 requests at once in 1.7 s instead of 0.25 s from the second round on (httpx's pool, 50 ms latency)
        protocol_version = "HTTP/1.0"
        disable_nagle_algorithm = True

        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            text = str(body["messages"][-1]["content"])
            time.sleep(latency)
            try:  # the demo's enricher asks in JSON ({"task": ..., "input": ...})
                prompt = json.loads(text)
                content = json.dumps(heuristic_answer(prompt["task"], prompt["input"]))
            except (ValueError, KeyError, TypeError):  # anything else (the README's example) gets a summary
                content = f"a summary of {text}"
            # usage as a real endpoint reports it, so the ledger, costs and metrics of the demo show tokens
            asked = sum(tokens(str(m.get("content", ""))) for m in body["messages"])
            answered = tokens(content)
            payload = json.dumps({"id": "demo", "object": "chat.completion", "created": int(time.time()),
                                  "model": body.get("model", "demo"),
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": content}}],
                                  "usage": {"prompt_tokens": asked, "completion_tokens": answered,
                                            "total_tokens": asked + answered}}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the demo killed the client mid-request

        def log_message(self, *args):
            pass

    server = _Server(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def main(argv: list[str] | None = None) -> None:
    """``python -m recovery_pipelines.demo_llm``: serve until interrupted (`make dev` runs it)."""
    parser = argparse.ArgumentParser(description="A local OpenAI-compatible LLM stand-in with latency.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency", type=float, default=1.0, help="Seconds per answer.")
    parser.add_argument("--check", action="store_true",
                        help="Only check that the port is free, then exit (0: free, 1: taken).")
    args = parser.parse_args(argv)
    if not 0 <= args.latency <= 60:
        parser.error("--latency must be between 0 and 60 seconds")
    try:
        server, url = serve(latency=args.latency, port=args.port)
    except OSError as exc:
        # `make dev` checks first: started in the background, a stand-in that cannot listen would leave
        # dagster dev pointed at whatever program holds the port
        parser.exit(1, f"demo LLM: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc} "
                       f"(a free port: make dev DEMO_LLM_PORT=...)\n")
    if args.check:
        server.shutdown()
        server.server_close()
        return
    print(f"demo LLM stand-in at {url} ({args.latency:g} s per answer)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
