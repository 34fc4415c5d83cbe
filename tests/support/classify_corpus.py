"""A labelled corpus for the classifier: exceptions raised by real libraries against local servers.

Nothing here is a pickled string: every case calls a real library (httpx, requests, urllib, the
openai SDK, sockets, asyncio, psycopg, SQLAlchemy, sqlite3) against a server or database on this
machine and keeps the exception it raised. The label is issue 10's policy; GPU messages (no GPU
here) and a few plain Python errors are constructed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import ssl
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import psycopg
import requests
import sqlalchemy
from sqlalchemy import create_engine, text
from sqlalchemy.pool import QueuePool

from recovery_ext._classify.classifier import ClassifiedError, with_context

TRANSIENT, PERMANENT = True, False
HTTP_CODES = (400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529)


@dataclass
class Case:
    name: str
    retryable: bool
    error: BaseException


def raised(fn: Callable[[], object]) -> BaseException:
    """Run ``fn`` and return what it raised; a call that succeeds is a broken case."""
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - collecting exceptions is the point
        return exc
    raise AssertionError(f"{fn} raised nothing")


# -- local servers ------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        parts = self.path.strip("/").split("/")
        if parts[0] == "status":
            code = int(parts[1])
            message = urllib.parse.unquote(parts[2]) if len(parts) > 2 and parts[2] != "v1" else f"status {code}"
            body = json.dumps({"error": {"message": message, "type": "error"}}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif parts[0] == "loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif parts[0] == "slow":
            time.sleep(1.5)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif parts[0] == "close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif parts[0] == "reset":
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def _serve_raw(handle: Callable[[socket.socket], None]) -> tuple[socket.socket, int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return listener, listener.getsockname()[1]


def _answers(banner: bytes) -> Callable[[socket.socket], None]:
    """A peer that reads the request, answers ``banner`` and hangs up."""

    def handle(conn: socket.socket) -> None:
        try:
            conn.settimeout(2)
            conn.recv(65536)
            conn.sendall(banner)
            time.sleep(0.5)
        except OSError:
            pass
        finally:
            conn.close()

    return handle


NOT_HTTP = b"SSH-2.0-OpenSSH_9.6\r\nProtocol mismatch.\r\n"          # an SSH server
RTSP = b"RTSP/1.0 200 OK\r\nCSeq: 1\r\nServer: camera\r\n\r\n"        # a streaming server: a foreign status line


def _closes_at_once(conn: socket.socket) -> None:
    conn.close()


def _pg_wrong_password(conn: socket.socket) -> None:
    """Enough of the PostgreSQL protocol to ask for a password and refuse it (28P01), like a real server."""
    try:
        conn.settimeout(5)
        while True:
            (length,) = struct.unpack("!i", conn.recv(4))
            body = conn.recv(length - 4)
            if struct.unpack("!i", body[:4])[0] in (80877103, 80877104):  # SSLRequest / GSSENCRequest
                conn.sendall(b"N")
                continue
            break
        conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
        conn.recv(1024)
        fields = b"".join(tag + value.encode() + b"\0" for tag, value in (
            (b"S", "FATAL"), (b"V", "FATAL"), (b"C", "28P01"),
            (b"M", 'password authentication failed for user "app"')))
        payload = fields + b"\0"
        conn.sendall(b"E" + struct.pack("!i", len(payload) + 4) + payload)
    except OSError:
        pass
    finally:
        conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def servers() -> Iterator[dict[str, object]]:
    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()
    raw = [_serve_raw(_answers(NOT_HTTP)), _serve_raw(_closes_at_once), _serve_raw(_pg_wrong_password),
           _serve_raw(_answers(RTSP))]
    try:
        yield {"http": f"http://127.0.0.1:{http.server_address[1]}", "port": http.server_address[1],
               "not_http": raw[0][1], "closer": raw[1][1], "fake_pg": raw[2][1], "rtsp": raw[3][1],
               "refused": _free_port()}
    finally:
        http.shutdown()
        http.server_close()
        for listener, _ in raw:
            listener.close()


# -- the cases ---------------------------------------------------------------------------------

def _openai(base_url: str, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-test", timeout=timeout, max_retries=0)


def _chat(client: openai.OpenAI) -> object:
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def _quote(text_: str) -> str:
    return urllib.parse.quote(text_, safe="")


def http_cases(s: dict) -> list[Case]:
    base = s["http"]
    cases = []
    for code in HTTP_CODES:
        expected = code in (408, 429, 500, 502, 503, 504, 529)
        url = f"{base}/status/{code}"
        cases += [
            Case(f"httpx {code}", expected, raised(lambda url=url: httpx.get(url).raise_for_status())),
            Case(f"requests {code}", expected, raised(lambda url=url: requests.get(url).raise_for_status())),
            Case(f"urllib {code}", expected, raised(lambda url=url: urllib.request.urlopen(url))),
            Case(f"openai {code}", expected, raised(lambda code=code: _chat(_openai(f"{base}/status/{code}/v1")))),
        ]
    # The status decides, whatever the body says.
    misleading = [
        (400, "Rate limit reached; the service is overloaded, try again later", PERMANENT, "httpx"),
        (400, "Rate limit reached; the service is overloaded, try again later", PERMANENT, "openai"),
        (503, "invalid api key", TRANSIENT, "httpx"),
        (503, "invalid api key", TRANSIENT, "openai"),
        (422, "request timed out upstream", PERMANENT, "requests"),
        (401, "connection reset by peer", PERMANENT, "openai"),
        (400, "This model's maximum context length is 8192 tokens, you requested 9000", PERMANENT, "openai"),
        (404, "model gpt-503-turbo does not exist", PERMANENT, "openai"),
    ]
    for code, body, expected, lib in misleading:
        url = f"{base}/status/{code}/{_quote(body)}"
        if lib == "httpx":
            fn = lambda url=url: httpx.get(url).raise_for_status()  # noqa: E731
        elif lib == "requests":
            fn = lambda url=url: requests.get(url).raise_for_status()  # noqa: E731
        else:
            fn = lambda code=code, body=body: _chat(_openai(f"{base}/status/{code}/{_quote(body)}/v1"))  # noqa: E731
        cases.append(Case(f"{lib} {code} body {body[:30]!r}", expected, raised(fn)))
    return cases


def network_cases(s: dict) -> list[Case]:
    base, refused, not_http, closer = s["http"], s["refused"], s["not_http"], s["closer"]
    plain_tls = f"https://127.0.0.1:{s['port']}/"
    cases = [
        # timeouts
        Case("httpx read timeout", TRANSIENT, raised(lambda: httpx.get(f"{base}/slow", timeout=0.2))),
        Case("requests read timeout", TRANSIENT, raised(lambda: requests.get(f"{base}/slow", timeout=0.2))),
        Case("urllib read timeout", TRANSIENT, raised(lambda: urllib.request.urlopen(f"{base}/slow", timeout=0.2))),
        Case("openai timeout", TRANSIENT, raised(lambda: _chat(_openai(f"{base}/slow/v1", timeout=0.2)))),
        Case("socket recv timeout", TRANSIENT, raised(lambda: _socket_recv_timeout(s["port"]))),
        Case("asyncio wait_for timeout", TRANSIENT,
             raised(lambda: asyncio.run(asyncio.wait_for(asyncio.sleep(5), 0.05)))),
        Case("httpx pool timeout", TRANSIENT, raised(lambda: _httpx_pool_timeout(base))),
        # refused
        Case("httpx refused", TRANSIENT, raised(lambda: httpx.get(f"http://127.0.0.1:{refused}/"))),
        Case("requests refused", TRANSIENT, raised(lambda: requests.get(f"http://127.0.0.1:{refused}/"))),
        Case("urllib refused", TRANSIENT, raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{refused}/"))),
        Case("openai refused", TRANSIENT, raised(lambda: _chat(_openai(f"http://127.0.0.1:{refused}/v1")))),
        Case("socket refused", TRANSIENT, raised(lambda: socket.create_connection(("127.0.0.1", refused), 2))),
        Case("asyncio refused", TRANSIENT, raised(lambda: asyncio.run(asyncio.open_connection("127.0.0.1", refused)))),
        # reset, closed without an answer, broken pipe, cut mid-read
        Case("httpx reset", TRANSIENT, raised(lambda: httpx.get(f"{base}/reset"))),
        Case("requests reset", TRANSIENT, raised(lambda: requests.get(f"{base}/reset"))),
        Case("urllib reset", TRANSIENT, raised(lambda: urllib.request.urlopen(f"{base}/reset"))),
        Case("openai reset", TRANSIENT, raised(lambda: _chat(_openai(f"{base}/reset/v1")))),
        Case("httpx server disconnected", TRANSIENT, raised(lambda: httpx.get(f"{base}/close"))),
        Case("requests remote disconnected", TRANSIENT, raised(lambda: requests.get(f"{base}/close"))),
        Case("urllib remote disconnected", TRANSIENT, raised(lambda: urllib.request.urlopen(f"{base}/close"))),
        Case("openai server disconnected", TRANSIENT, raised(lambda: _chat(_openai(f"{base}/close/v1")))),
        Case("socket broken pipe", TRANSIENT, raised(lambda: _broken_pipe(closer))),
        Case("asyncio incomplete read", TRANSIENT, raised(lambda: asyncio.run(_incomplete_read(closer)))),
        # DNS (a .invalid name never resolves)
        Case("httpx dns", TRANSIENT, raised(lambda: httpx.get("http://llm.invalid/v1"))),
        Case("requests dns", TRANSIENT, raised(lambda: requests.get("http://llm.invalid/v1"))),
        Case("urllib dns", TRANSIENT, raised(lambda: urllib.request.urlopen("http://llm.invalid/v1"))),
        Case("openai dns", TRANSIENT, raised(lambda: _chat(_openai("http://llm.invalid/v1")))),
        Case("socket getaddrinfo", TRANSIENT, raised(lambda: socket.getaddrinfo("llm.invalid", 80))),
        Case("asyncio dns", TRANSIENT, raised(lambda: asyncio.run(asyncio.open_connection("llm.invalid", 80)))),
        Case("psycopg dns", TRANSIENT,
             raised(lambda: psycopg.connect("postgresql://u@db.invalid/x", connect_timeout=3))),
        # TLS against a plain-HTTP port
        Case("httpx tls to plain port", PERMANENT, raised(lambda: httpx.get(plain_tls))),
        Case("requests tls to plain port", PERMANENT, raised(lambda: requests.get(plain_tls))),
        Case("urllib tls to plain port", PERMANENT, raised(lambda: urllib.request.urlopen(plain_tls))),
        Case("openai tls to plain port", PERMANENT, raised(lambda: _chat(_openai(plain_tls + "v1")))),
        Case("ssl socket to plain port", PERMANENT, raised(lambda: _raw_tls(s["port"]))),
        # a peer that does not speak HTTP
        Case("httpx non-http peer", PERMANENT, raised(lambda: httpx.get(f"http://127.0.0.1:{s['rtsp']}/"))),
        Case("requests rtsp peer", PERMANENT, raised(lambda: requests.get(f"http://127.0.0.1:{s['rtsp']}/"))),
        Case("requests non-http peer", PERMANENT, raised(lambda: requests.get(f"http://127.0.0.1:{not_http}/"))),
        Case("urllib non-http peer", PERMANENT,
             raised(lambda: urllib.request.urlopen(f"http://127.0.0.1:{not_http}/"))),
        Case("openai non-http peer", PERMANENT, raised(lambda: _chat(_openai(f"http://127.0.0.1:{s['rtsp']}/v1")))),
        # bad URLs, schemes, headers, redirect loops
        Case("httpx no scheme", PERMANENT, raised(lambda: httpx.get(f"127.0.0.1:{s['port']}/v1"))),
        Case("requests no scheme", PERMANENT, raised(lambda: requests.get(f"127.0.0.1:{s['port']}/v1"))),
        Case("requests missing scheme", PERMANENT, raised(lambda: requests.get("llm.local/v1"))),
        Case("urllib no scheme", PERMANENT, raised(lambda: urllib.request.urlopen(f"127.0.0.1:{s['port']}/v1"))),
        Case("openai no scheme", PERMANENT, raised(lambda: _chat(_openai(f"127.0.0.1:{s['port']}/v1")))),
        Case("httpx ftp scheme", PERMANENT, raised(lambda: httpx.get(f"ftp://127.0.0.1:{s['port']}/"))),
        Case("requests ftp scheme", PERMANENT, raised(lambda: requests.get(f"ftp://127.0.0.1:{s['port']}/"))),
        Case("urllib gopher scheme", PERMANENT,
             raised(lambda: urllib.request.urlopen(f"gopher://127.0.0.1:{s['port']}/"))),
        Case("httpx invalid url", PERMANENT, raised(lambda: httpx.get("http://[::1"))),
        Case("requests invalid url", PERMANENT, raised(lambda: requests.get("http://"))),
        Case("urllib no host", PERMANENT, raised(lambda: urllib.request.urlopen("http:///v1"))),
        Case("requests bad header", PERMANENT, raised(lambda: requests.get(base, headers={"X-Id": "a\nb"}))),
        Case("httpx bad header", PERMANENT, raised(lambda: httpx.get(base, headers={"X-Id": "a\nb"}))),
        Case("httpx redirect loop", PERMANENT, raised(lambda: httpx.get(f"{base}/loop", follow_redirects=True))),
        Case("requests redirect loop", PERMANENT, raised(lambda: requests.get(f"{base}/loop"))),
        Case("urllib redirect loop", PERMANENT, raised(lambda: urllib.request.urlopen(f"{base}/loop"))),
    ]
    return cases


def _socket_recv_timeout(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), 2) as conn:
        conn.settimeout(0.1)
        conn.recv(10)  # the server waits for a request that never comes


def _httpx_pool_timeout(base: str) -> None:
    client = httpx.Client(limits=httpx.Limits(max_connections=1), timeout=httpx.Timeout(5.0, pool=0.1))
    holder = threading.Thread(target=lambda: client.get(f"{base}/slow"), daemon=True)
    holder.start()
    time.sleep(0.3)
    try:
        client.get(f"{base}/")
    finally:
        holder.join()
        client.close()


def _broken_pipe(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), 2) as conn:
        time.sleep(0.2)
        for _ in range(200):
            conn.sendall(b"x" * 65536)


async def _incomplete_read(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.readexactly(100)
    finally:
        writer.close()


def _raw_tls(port: int) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (socket.create_connection(("127.0.0.1", port), 2) as conn,
          context.wrap_socket(conn, server_hostname="127.0.0.1") as tls):
        tls.sendall(b"GET / HTTP/1.1\r\n\r\n")


# -- databases -----------------------------------------------------------------------------------

def postgres_cases(url: str, s: dict) -> list[Case]:
    """``url`` is a fresh database this function may change (the test creates and drops it)."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    base = conninfo.rsplit("/", 1)[0]
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, retry_timeout int,"
                      " CONSTRAINT chk_timeout_positive CHECK (retry_timeout > 0))")
        admin.execute("CREATE TABLE orders (id int PRIMARY KEY, account_id int REFERENCES accounts(id))")
        admin.execute("INSERT INTO accounts VALUES (1, 100, 5), (2, 100, 5)")
        role = f"rx_corpus_{uuid.uuid4().hex[:8]}"
        admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
    try:
        def run(sql: str, *setup: str) -> Callable[[], None]:
            def fn() -> None:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    for statement in setup:
                        conn.execute(statement)
                    conn.execute(sql)
            return fn

        cases = [
            Case("psycopg missing database", PERMANENT, raised(lambda: psycopg.connect(f"{base}/rx_no_such_database"))),
            Case("psycopg wrong password", PERMANENT, raised(lambda: psycopg.connect(
                f"postgresql://app:wrong@127.0.0.1:{s['fake_pg']}/app", sslmode="disable", gssencmode="disable",
                connect_timeout=3))),
            Case("psycopg unknown role", PERMANENT, raised(lambda: psycopg.connect(
                base.replace("postgres@", "rx_nobody@") + "/postgres"))),
            Case("psycopg refused", TRANSIENT, raised(lambda: psycopg.connect(
                f"postgresql://postgres@127.0.0.1:{s['refused']}/x", connect_timeout=3))),
            Case("psycopg too many connections for role", TRANSIENT, raised(lambda: psycopg.connect(
                base.replace("postgres@", f"{role}@") + "/postgres"))),
            Case("psycopg lock timeout", TRANSIENT, raised(lambda: _pg_lock_timeout(conninfo))),
            Case("psycopg idle in transaction timeout", TRANSIENT, raised(lambda: _pg_idle_timeout(conninfo))),
            Case("psycopg statement timeout", TRANSIENT,
                 raised(run("SELECT pg_sleep(2)", "SET statement_timeout = '50ms'"))),
            Case("psycopg deadlock", TRANSIENT, raised(lambda: _pg_deadlock(conninfo))),
            Case("psycopg serialization failure", TRANSIENT, raised(lambda: _pg_serialization(conninfo))),
            Case("psycopg admin shutdown", TRANSIENT, raised(lambda: _pg_terminated(conninfo))),
            Case("psycopg query canceled", TRANSIENT, raised(lambda: _pg_canceled(conninfo))),
            Case("psycopg unique violation", PERMANENT, raised(run("INSERT INTO accounts VALUES (1, 0, 5)"))),
            Case("psycopg foreign key violation", PERMANENT, raised(run("INSERT INTO orders VALUES (1, 503)"))),
            Case("psycopg check constraint named timeout", PERMANENT,
                 raised(run("INSERT INTO accounts VALUES (9, 0, -1)"))),
            Case("psycopg not null", PERMANENT, raised(run("INSERT INTO accounts VALUES (10, NULL, 1)"))),
            Case("psycopg undefined table", PERMANENT, raised(run("SELECT * FROM rate_limits_503"))),
            Case("psycopg undefined column named timeout", PERMANENT,
                 raised(run("SELECT read_timeout_504 FROM accounts"))),
            Case("psycopg syntax error", PERMANENT, raised(run("SELEC 1"))),
            Case("psycopg division by zero", PERMANENT, raised(run("SELECT 1/0"))),
            Case("psycopg invalid input", PERMANENT, raised(run("SELECT 'timeout'::int"))),
            Case("psycopg unknown parameter named timeout", PERMANENT,
                 raised(run("SET no_such.lock_timeout_x TO 1; SHOW lock_timeout_x"))),
        ]
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"),
                               poolclass=sqlalchemy.pool.NullPool)
        try:
            def sa(sql: str, *setup: str) -> Callable[[], None]:
                def fn() -> None:
                    with engine.begin() as conn:
                        for statement in setup:
                            conn.execute(text(statement))
                        conn.execute(text(sql))
                return fn

            cases += [
                Case("sqlalchemy pg unique violation", PERMANENT, raised(sa("INSERT INTO accounts VALUES (2, 0, 5)"))),
                Case("sqlalchemy pg check constraint", PERMANENT, raised(sa("UPDATE accounts SET retry_timeout = 0"))),
                Case("sqlalchemy pg undefined table", PERMANENT, raised(sa("SELECT * FROM timeouts"))),
                Case("sqlalchemy pg statement timeout", TRANSIENT,
                     raised(sa("SELECT pg_sleep(2)", "SET LOCAL statement_timeout = '50ms'"))),
                Case("sqlalchemy pg lock timeout", TRANSIENT, raised(lambda: _sa_lock_timeout(engine))),
                Case("sqlalchemy pg missing database", PERMANENT, raised(lambda: create_engine(
                    base.replace("postgresql://", "postgresql+psycopg://") + "/rx_missing_db").connect())),
                Case("sqlalchemy pg refused", TRANSIENT, raised(lambda: create_engine(
                    f"postgresql+psycopg://postgres@127.0.0.1:{s['refused']}/x").connect())),
                Case("sqlalchemy bad url", PERMANENT, raised(lambda: create_engine("postgresql//nohost"))),
                Case("sqlalchemy unknown dialect", PERMANENT, raised(lambda: create_engine("nosuchdb://x/y"))),
            ]
        finally:
            engine.dispose()
    finally:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    return cases


def _pg_lock_timeout(conninfo: str) -> None:
    with psycopg.connect(conninfo) as holder, psycopg.connect(conninfo) as waiter:
        holder.execute("SELECT * FROM accounts WHERE id = 1 FOR UPDATE")
        waiter.execute("SET lock_timeout = '100ms'")
        waiter.execute("UPDATE accounts SET balance = 0 WHERE id = 1")


def _sa_lock_timeout(engine) -> None:
    with engine.connect() as holder, engine.connect() as waiter:
        holder.execute(text("SELECT * FROM accounts WHERE id = 2 FOR UPDATE"))
        waiter.execute(text("SET lock_timeout = '100ms'"))
        waiter.execute(text("UPDATE accounts SET balance = 0 WHERE id = 2"))


def _pg_idle_timeout(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute("SET idle_in_transaction_session_timeout = '100ms'")
        conn.execute("SELECT 1")
        time.sleep(0.6)
        conn.execute("SELECT 1")


def _pg_deadlock(conninfo: str) -> None:
    a, b = psycopg.connect(conninfo), psycopg.connect(conninfo)
    errors: list[BaseException] = []
    try:
        a.execute("SET deadlock_timeout = '50ms'")
        b.execute("SET deadlock_timeout = '50ms'")
        a.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        b.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")

        def cross(conn, row):
            try:
                conn.execute(f"UPDATE accounts SET balance = balance + 1 WHERE id = {row}")
            except psycopg.Error as exc:
                errors.append(exc)
                conn.rollback()

        other = threading.Thread(target=cross, args=(b, 1))
        other.start()
        time.sleep(0.2)
        cross(a, 2)
        other.join()
    finally:
        a.close()
        b.close()
    raise errors[0]


def _pg_serialization(conninfo: str) -> None:
    with psycopg.connect(conninfo) as a, psycopg.connect(conninfo) as b:
        a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        a.execute("SELECT balance FROM accounts WHERE id = 2")
        b.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 2")
        b.commit()
        a.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")


def _pg_terminated(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as victim, psycopg.connect(conninfo, autocommit=True) as admin:
        pid = victim.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.2)
        victim.execute("SELECT 1")


def _pg_canceled(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as victim, psycopg.connect(conninfo, autocommit=True) as admin:
        pid = victim.info.backend_pid
        timer = threading.Timer(0.3, lambda: admin.execute("SELECT pg_cancel_backend(%s)", (pid,)))
        timer.start()
        try:
            victim.execute("SELECT pg_sleep(3)")
        finally:
            timer.join()


def sqlite_cases(folder) -> list[Case]:
    path = folder / "corpus.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, timeout_seconds INTEGER CHECK (timeout_seconds > 0))")
        conn.execute("INSERT INTO jobs VALUES (1, 5)")

    def run(sql: str) -> Callable[[], None]:
        def fn() -> None:
            with sqlite3.connect(path) as conn:
                conn.execute(sql)
        return fn

    def locked() -> None:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            sqlite3.connect(path, timeout=0.05, isolation_level=None).execute("BEGIN IMMEDIATE")
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})

    def sa_locked() -> None:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with engine.begin() as conn:
                conn.execute(text("UPDATE jobs SET timeout_seconds = 6"))
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    def sa_pool_timeout() -> None:
        pooled = create_engine(f"sqlite:///{path}", poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=0.1)
        held = pooled.connect()
        try:
            pooled.connect()
        finally:
            held.close()
            pooled.dispose()

    try:
        return [
            Case("sqlite database is locked", TRANSIENT, raised(locked)),
            Case("sqlite no such table", PERMANENT, raised(run("SELECT * FROM rate_limit_429"))),
            Case("sqlite no such column named timeout", PERMANENT, raised(run("SELECT read_timeout FROM jobs"))),
            Case("sqlite unique", PERMANENT, raised(run("INSERT INTO jobs VALUES (1, 5)"))),
            Case("sqlite check constraint named timeout", PERMANENT, raised(run("INSERT INTO jobs VALUES (2, 0)"))),
            Case("sqlite syntax error", PERMANENT, raised(run("SELEC 503"))),
            Case("sqlite unable to open", PERMANENT, raised(lambda: sqlite3.connect(folder / "missing" / "x.db"))),
            Case("sqlalchemy sqlite locked", TRANSIENT, raised(sa_locked)),
            Case("sqlalchemy sqlite integrity", PERMANENT,
                 raised(lambda: _sa_exec(engine, "INSERT INTO jobs VALUES (1, 1)"))),
            Case("sqlalchemy pool timeout", TRANSIENT, raised(sa_pool_timeout)),
        ]
    finally:
        engine.dispose()


def _sa_exec(engine, sql: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql))


# -- plain Python, GPU messages, flags and chains ------------------------------------------------------

class OutOfMemoryError(RuntimeError):
    """Shaped like ``torch.cuda.OutOfMemoryError``."""


class Flagged(Exception):
    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def _chained(outer: BaseException, inner: Callable[[], object]) -> BaseException:
    cause = raised(inner)

    def fn() -> None:
        raise outer from cause

    return raised(fn)


def python_cases(s: dict, folder) -> list[Case]:
    refused = f"http://127.0.0.1:{s['refused']}/"
    base = s["http"]
    return [
        Case("ValueError mentioning a timeout", PERMANENT, raised(lambda: _validate_timeout(-1))),
        Case("ValueError mentioning a status", PERMANENT, raised(lambda: _validate_status(503))),
        Case("TypeError with a timeout parameter", PERMANENT, raised(lambda: httpx.get(base, read_timeout=1))),
        Case("KeyError rate_limit", PERMANENT, raised(lambda: {}["rate_limit"])),
        Case("json decode error", PERMANENT, raised(lambda: json.loads("{'error': 'service unavailable'"))),
        Case("file not found", PERMANENT, raised(lambda: open(folder / "no-such-503.pdf"))),
        Case("int() of a status-like text", PERMANENT, raised(lambda: int("503 Service Unavailable"))),
        Case("runtime: number is an order id", PERMANENT, raised(lambda: _fail("order 503 could not be reconciled"))),
        Case("runtime: token counts", PERMANENT,
             raised(lambda: _fail("used 429 prompt tokens and 503 completion tokens"))),
        Case("runtime: status in a path", PERMANENT, raised(lambda: _fail("no body at /v1/files/file-503/content"))),
        Case("runtime: header name", PERMANENT, raised(lambda: _fail("missing header x-ratelimit-remaining"))),
        Case("runtime: setting name", PERMANENT, raised(lambda: _fail("unknown setting lock_timeout_ms=5"))),
        Case("runtime: request id", PERMANENT, raised(lambda: _fail("request req_timeout_504_abc failed validation"))),
        Case("runtime: rate limit message", TRANSIENT,
             raised(lambda: _fail("Rate limit reached for gpt-4o on tokens per min"))),
        Case("runtime: 503 phrase", TRANSIENT, raised(lambda: _fail("upstream said: 503 Service Unavailable"))),
        Case("runtime: overloaded", TRANSIENT, raised(lambda: _fail("Overloaded: the model is overloaded, retry"))),
        Case("gpu: cuda error", TRANSIENT,
             raised(lambda: _fail("CUDA error: an illegal memory access was encountered"))),
        Case("gpu: torch oom", TRANSIENT, raised(lambda: _raise(OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)")))),
        Case("gpu: gpu error", TRANSIENT, raised(lambda: _fail("GPU error: Xid 79, GPU has fallen off the bus"))),
        Case("gpu: remote oom", TRANSIENT, raised(lambda: _fail("OCR worker reported: out of memory"))),
        Case("gpu: cudnn", TRANSIENT, raised(lambda: _fail("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"))),
        Case("gpu: cublas", TRANSIENT, raised(lambda: _fail("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))),
        Case("gpu: identifier only", PERMANENT, raised(lambda: _fail("metric nvidia_gpu_error_count missing"))),
        Case("flag: permanent around refused", PERMANENT, _chained(Flagged("give up", retryable=False),
                                                                     lambda: httpx.get(refused))),
        Case("flag: transient around ValueError", TRANSIENT, _chained(Flagged("try again", retryable=True),
                                                                       lambda: _validate_timeout(0))),
        Case("chain: wrapper around refused", TRANSIENT, _chained(RuntimeError("enrichment failed"),
                                                                   lambda: httpx.get(refused))),
        Case("chain: ValueError from a read timeout", TRANSIENT, _chained(
            ValueError("bad answer"), lambda: httpx.get(f"{base}/slow", timeout=0.2))),
        Case("chain: wrapper around ValueError", PERMANENT, _chained(RuntimeError("step failed"),
                                                                      lambda: _validate_timeout(0))),
        Case("classified: openai 503 with context", TRANSIENT,
             with_context(raised(lambda: _chat(_openai(f"{base}/status/503/v1"))), model="m", endpoint=base)),
        Case("classified: explicit permanent", PERMANENT,
             ClassifiedError(raised(lambda: httpx.get(refused)), retryable=False, message="circuit gave up")),
    ]


def _validate_timeout(value: float) -> None:
    if value <= 0:
        raise ValueError(f"timeout must be positive, got {value}; request timed out is not a valid default")


def _validate_status(code: int) -> None:
    raise ValueError(f"status code {code} is not an allowed fallback status in the config")


def _fail(message: str) -> None:
    raise RuntimeError(message)


def _raise(exc: BaseException) -> None:
    raise exc


def build_corpus(pg_url: str, folder) -> list[Case]:
    with servers() as s:
        return (http_cases(s) + network_cases(s) + postgres_cases(pg_url, s) + sqlite_cases(folder)
                + python_cases(s, folder))
