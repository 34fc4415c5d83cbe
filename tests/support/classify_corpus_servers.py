"""Local servers the library corpus drives real clients against (all on 127.0.0.1, stopped after use).

* :class:`ScriptedHTTP`: an HTTP/1.1 server that answers every request with the response scripted
  last (status, headers, body; or it closes, resets, stalls or redirects in a loop);
* :func:`grpc_server`: a real grpcio server whose method ``/corpus.Svc/<CODE>`` aborts with that code;
* :func:`serve_lines`: a line-protocol peer (RESP for Redis, SMTP) answering each line from a script;
* :func:`mysql_server`: enough of the MySQL wire protocol to greet, accept any login, and answer each
  query ``SELECT <errno>`` (or the greeting itself) with that error packet, as a real server would.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from classify_corpus import Handler as FirstCorpusHandler
from classify_corpus import _serve_raw


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up on a stalled or cut answer is what the case is about


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    action: str = ""  # "close", "reset", "stall", "short" (promise more body than is sent)


class ScriptedHTTP:
    def __init__(self) -> None:
        self.reply = Reply()
        script = self

        class Handler(FirstCorpusHandler):
            def _answer(self) -> None:
                reply = script.reply
                if reply.action in ("close", "reset"):  # hang up the way the first corpus's server does
                    self.path = f"/{reply.action}"
                    return super()._answer()
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if reply.action == "stall":
                    time.sleep(1.5)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                extra = 100 if reply.action == "short" else 0
                self.send_header("Content-Length", str(len(reply.body) + extra))
                self.end_headers()
                self.wfile.write(reply.body)
                if extra:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def script(self, status: int = 200, body: bytes | str = b"", headers: dict[str, str] | None = None,
               action: str = "") -> None:
        self.reply = Reply(status, body.encode() if isinstance(body, str) else body, dict(headers or {}), action)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- gRPC ----------------------------------------------------------------------------------------

@contextmanager
def grpc_server() -> Iterator[int]:
    from concurrent import futures

    import grpc

    def behaviour(code_name: str):
        def unary(request: bytes, context) -> bytes:
            if code_name == "SLOW":
                time.sleep(2)
                return b""
            if code_name == "CRASH":
                raise RuntimeError("the servicer crashed")
            context.abort(getattr(grpc.StatusCode, code_name), f"the server says {code_name.lower()}")
        return grpc.unary_unary_rpc_method_handler(unary)

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            return behaviour(details.method.rsplit("/", 1)[-1])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


# -- line protocols (Redis RESP, SMTP) -----------------------------------------------------------

def serve_lines(greeting: Callable[[], bytes | None], answer: Callable[[bytes], bytes | None]):
    """Each connection gets ``greeting()`` (None: hang up at once), then ``answer(line)`` per line
    received (None: hang up; b"": say nothing)."""

    def handle(conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            hello = greeting()
            if hello is None:
                return
            conn.sendall(hello)
            buffer = b""
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
                while b"\r\n" in buffer:
                    line, buffer = buffer.split(b"\r\n", 1)
                    reply = answer(line)
                    if reply is None:
                        return
                    if reply:
                        conn.sendall(reply)
        except OSError:
            pass
        finally:
            conn.close()

    return _serve_raw(handle)


# -- MySQL wire protocol --------------------------------------------------------------------------

def _packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def mysql_error(seq: int, errno_: int, state: str, message: str) -> bytes:
    return _packet(seq, b"\xff" + struct.pack("<H", errno_) + b"#" + state.encode() + message.encode())


_CAPABILITIES = 0x00000001 | 0x00000200 | 0x00008000 | 0x00080000 | 0x00000008  # 4.1 protocol, plugin auth


def _greeting() -> bytes:
    payload = (b"\x0a" + b"8.0.36-corpus\0" + struct.pack("<I", 7) + b"abcdefgh\0"
               + struct.pack("<H", _CAPABILITIES & 0xFFFF) + bytes([45]) + struct.pack("<H", 2)
               + struct.pack("<H", _CAPABILITIES >> 16) + bytes([21]) + b"\0" * 10 + b"ijklmnopqrst\0"
               + b"mysql_native_password\0")
    return _packet(0, payload)


def _read_packet(conn: socket.socket) -> bytes | None:
    header = conn.recv(4)
    if len(header) < 4:
        return None
    length = int.from_bytes(header[:3], "little")
    body = b""
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return body


def mysql_server(at_greeting: tuple[int, str, str] | None = None, after_login: tuple[int, str, str] | None = None):
    """A MySQL peer. ``at_greeting``/``after_login``: an error packet instead of the greeting / the login OK.
    After login, ``SELECT <errno>`` answers with that errno (state and message from :data:`MYSQL_ERRORS`),
    ``SELECT 0`` hangs up mid-query and ``SELECT -1`` never answers."""

    def handle(conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            if at_greeting:
                conn.sendall(mysql_error(0, *at_greeting))
                return
            conn.sendall(_greeting())
            if _read_packet(conn) is None:
                return
            if after_login:
                conn.sendall(mysql_error(2, *after_login))
                return
            conn.sendall(_packet(2, b"\x00\x00\x00\x02\x00\x00\x00"))
            while True:
                query = _read_packet(conn)
                if query is None or query[:1] == b"\x01":  # gone, or COM_QUIT
                    return
                words = query[1:].decode(errors="replace").split()
                if len(words) != 2 or words[0].upper() != "SELECT" or not words[1].lstrip("-").isdigit():
                    conn.sendall(_packet(1, b"\x00\x00\x00\x02\x00\x00\x00"))  # SET AUTOCOMMIT ... : OK
                    continue
                code = int(words[1])
                if code == 0:
                    return
                if code == -1:
                    time.sleep(3)
                    return
                state, message = MYSQL_ERRORS.get(code, ("HY000", f"error {code}"))
                conn.sendall(mysql_error(1, code, state, message))
        except OSError:
            pass
        finally:
            conn.close()

    return _serve_raw(handle)


MYSQL_ERRORS = {
    1040: ("08004", "Too many connections"),
    1053: ("08S01", "Server shutdown in progress"),
    1203: ("42000", "User app already has more than 'max_user_connections' active connections"),
    1290: ("HY000", "The MySQL server is running with the --read-only option so it cannot execute this statement"),
    3024: ("HY000", "Query execution was interrupted, maximum statement execution time exceeded"),
    4031: ("HY000", "The client was disconnected by the server because of inactivity."),
    1927: ("70100", "Connection was killed"),
    1045: ("28000", "Access denied for user 'app'@'127.0.0.1' (using password: YES)"),
    1044: ("42000", "Access denied for user 'app'@'%' to database 'ledger'"),
    1142: ("42000", "INSERT command denied to user 'app'@'127.0.0.1' for table 'calls'"),
    1637: ("HY000", "Too many active concurrent transactions"),
}
