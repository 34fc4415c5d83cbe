"""What the providers' local stand-ins share: a quiet HTTP/1.1 handler and a threaded server on 127.0.0.1 at a
free port, served from a daemon thread."""

from __future__ import annotations

import contextlib
import threading
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError):  # a killed client's kept-alive connection: nothing to answer
            super().handle()

    def _send_bytes(self, status: int, data: bytes, kind: str = "application/octet-stream",
                    headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client went away (a killed run worker)
            pass

    def log_message(self, *args) -> None:
        pass


class LocalServer:
    """``start_server`` serves ``handler()`` on 127.0.0.1; ``stop`` ends it. A context manager."""

    server: ThreadingHTTPServer | None = None
    url = ""
    url_path = ""  # the API's root under the server's address (e.g. "/v1")

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def start_server(self) -> str:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{self.url_path}"
        return self.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self):
        self.start_server()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class BatchServer(LocalServer):
    """A batch API's stand-in: the batches it created (each with what it ``answered``: custom_id, tokens in,
    tokens out), and a ``released`` event that lets a held answer go out when it stops.

    Crash points of a creation: ``hold_create=S`` holds the answer to the first creation for up to S seconds
    after the batch exists (a client killed then never learns its id); ``drop_first_create=S`` holds the first
    creation request for up to S seconds *before* any batch exists, then drops it (a client killed then
    created nothing). ``creates`` counts the creation requests (a dropped or repeated one included).
    ``hold_nth=N`` holds the answer to the N-th creation instead of the first (a client that creates one
    thing per item, killed after N-1 of them were answered)."""

    def __init__(self, hold_create: float = 0.0, drop_first_create: float = 0.0, hold_nth: int = 1) -> None:
        self.batches: dict[str, Any] = {}
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.hold_create, self.drop_first_create, self.hold_nth = hold_create, drop_first_create, hold_nth
        self.creates = 0

    def creation_arrived(self) -> bool:
        """Count a creation request; False (after holding it) when it is the first and is to be dropped."""
        with self.lock:
            self.creates += 1
            drop = self.creates == 1 and self.drop_first_create
        if drop:
            self.released.wait(self.drop_first_create)
        return not drop

    def created(self) -> None:
        """A batch was just created: hold its answer when it is the first and answers are held."""
        with self.lock:
            hold = self.hold_create if len(self.batches) == self.hold_nth else 0.0
        if hold:
            self.released.wait(hold)

    @property
    def submissions(self) -> int:
        with self.lock:
            return len(self.batches)

    def answered(self) -> list[tuple[str, int, int]]:
        with self.lock:
            self._settle()
            return [a for b in self.batches.values() for a in b.answered]

    def _settle(self) -> None:
        """Bring every batch up to date before counting (a stand-in whose batches end only when asked)."""

    def stop(self) -> None:
        self.released.set()  # a held answer goes out before the server stops
        super().stop()
