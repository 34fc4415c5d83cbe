"""A third labelled corpus, the other half (see tests/support/classify_corpus_generic.py for the policy).

Real clients against the local RabbitMQ (pika), against MQTT, NATS, FTP and SSH peers the corpus starts on
127.0.0.1 (each answers the way a server in that state does: a CONNACK refusal, an ``-ERR`` line, an FTP
reply code, a silent or foreign banner) and the local NATS server; then a document store's client
(pymongo), OCR through pytesseract with stand-in ``tesseract`` binaries, subprocesses, output parsers,
and this machine's own resources run out for real (a lowered file-descriptor limit, ``/dev/full``, an
impossible allocation).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import mmap
import os
import resource
import socket
import sqlite3
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from classify_corpus import _closes_at_once, _free_port, _serve_raw
from classify_corpus_libraries import PERMANENT, TRANSIENT, LibCase, case
from classify_corpus_servers import ScriptedHTTP, serve_lines


def _replies(payload: bytes, *, read_first: bool = True) -> Callable[[socket.socket], None]:
    """A peer that (reads a request then) sends ``payload`` and waits for the client to hang up."""

    def handle(conn: socket.socket) -> None:
        try:
            conn.settimeout(3)
            if read_first:
                conn.recv(4096)
            conn.sendall(payload)
            conn.recv(4096)
        except OSError:
            pass
        finally:
            conn.close()

    return handle


def _silent(conn: socket.socket) -> None:
    try:
        conn.settimeout(3)
        conn.recv(4096)
    except OSError:
        pass
    finally:
        conn.close()


# -- RabbitMQ through pika ---------------------------------------------------------------------------

def pika_cases() -> list[LibCase]:
    import pika

    def connect(port: int = 5672, **kwargs):
        params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=1,
                                           blocked_connection_timeout=2, **kwargs)
        return lambda: pika.BlockingConnection(params)

    _, hangs_up = _serve_raw(_closes_at_once)
    cases = [
        case("pika-refused", TRANSIENT, connect(_free_port()), "pika BlockingConnection to a closed port"),
        case("pika-hangs-up", TRANSIENT, connect(hangs_up), "pika BlockingConnection; the peer closes at once"),
        case("pika-bad-password", PERMANENT, connect(credentials=pika.PlainCredentials("guest", "wrong")),
             "pika BlockingConnection to the local RabbitMQ with a wrong password"),
        case("pika-no-vhost", PERMANENT, connect(virtual_host="corpus-no-such-vhost"),
             "pika BlockingConnection to the local RabbitMQ, a vhost that does not exist (530)"),
    ]
    owner = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    other = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        owner.channel().queue_declare("corpus-exclusive", exclusive=True)
        owner.channel().queue_declare("corpus-transient-q", durable=False, auto_delete=True)
        def channel():
            return other.channel()
        cases += [
            case("pika-queue-missing", PERMANENT, lambda: channel().queue_declare("corpus-missing", passive=True),
                 "pika passive queue_declare of a queue that does not exist (404)"),
            case("pika-reserved-name", PERMANENT, lambda: channel().queue_declare("amq.corpus"),
                 "pika queue_declare of a name with the reserved amq. prefix (403)"),
            case("pika-precondition", PERMANENT,
                 lambda: channel().queue_declare("corpus-transient-q", durable=True),
                 "pika queue_declare of an existing queue with other arguments (406 PRECONDITION_FAILED)"),
            case("pika-exclusive-locked", TRANSIENT, lambda: channel().queue_declare("corpus-exclusive"),
                 "pika queue_declare of another connection's exclusive queue (405 RESOURCE_LOCKED)"),
            case("pika-exchange-missing", PERMANENT,
                 lambda: channel().basic_publish("corpus-no-exchange", "k", b"x") or other.process_data_events(1)
                 or channel().exchange_declare("corpus-no-exchange", passive=True),
                 "pika passive exchange_declare of an exchange that does not exist (404)"),
        ]
    finally:
        other.close()
        owner.close()
    return cases


# -- MQTT through paho-mqtt ------------------------------------------------------------------------------

def mqtt_cases() -> list[LibCase]:
    import paho.mqtt.client as mqtt
    import paho.mqtt.publish as publish

    def send(port: int, **kwargs):
        return lambda: publish.single("corpus/t", "x", hostname="127.0.0.1", port=port, keepalive=5, **kwargs)

    cases = [case("mqtt-refused", TRANSIENT, send(_free_port()), "paho-mqtt publish.single to a closed port")]
    for code, what, label in [(1, "unacceptable protocol version", PERMANENT), (2, "identifier rejected", PERMANENT),
                              (3, "server unavailable", TRANSIENT), (4, "bad user name or password", PERMANENT),
                              (5, "not authorised", PERMANENT)]:
        _, port = _serve_raw(_replies(b"\x20\x02\x00" + bytes([code])))
        cases.append(case(f"mqtt-connack-{code}", label, send(port),
                          f"paho-mqtt publish.single (MQTT 3.1.1); the peer's CONNACK refuses: {what}"))
    for code, what, label in [(0x88, "server unavailable", TRANSIENT), (0x89, "server busy", TRANSIENT),
                              (0x97, "quota exceeded", TRANSIENT), (0x9F, "connection rate exceeded", TRANSIENT),
                              (0x86, "bad user name or password", PERMANENT), (0x87, "not authorized", PERMANENT),
                              (0x8C, "bad authentication method", PERMANENT), (0x85, "client id not valid", PERMANENT),
                              (0x8A, "banned", PERMANENT)]:
        _, port = _serve_raw(_replies(b"\x20\x03\x00" + bytes([code]) + b"\x00"))
        cases.append(case(f"mqtt5-connack-{code:#x}", label, send(port, protocol=mqtt.MQTTv5),
                          f"paho-mqtt publish.single (MQTT 5); the peer's CONNACK reason code {code:#x}: {what}"))
    return cases


# -- NATS through nats-py --------------------------------------------------------------------------------

def nats_cases() -> list[LibCase]:
    import nats

    def run(coroutine_fn):
        return lambda: asyncio.run(coroutine_fn())

    async def _quiet(error: Exception) -> None:
        pass  # the error raised is the case; the client's log of it is noise

    async def connect(port: int, **kwargs):
        return await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1, allow_reconnect=False,
                                  max_reconnect_attempts=1, reconnect_time_wait=0.1,
                                  error_cb=_quiet, **kwargs)

    async def request_nobody():
        nc = await connect(4222)
        try:
            await nc.request("corpus.nobody.listens", b"x", timeout=1)
        finally:
            await nc.close()

    async def request_silent():
        nc = await connect(4222)
        try:
            async def never_replies(msg) -> None:
                pass

            await nc.subscribe("corpus.silent", cb=never_replies)
            await nc.request("corpus.silent", b"x", timeout=0.3)
        finally:
            await nc.close()

    async def too_big():
        nc = await connect(4222)
        try:
            await nc.publish("corpus.big", b"x" * (nc.max_payload + 1))
        finally:
            await nc.close()

    async def bad_subject():
        nc = await connect(4222)
        try:
            await nc.publish("", b"x")
        finally:
            await nc.close()

    info = b'INFO {"server_id":"corpus","version":"2.10.0","max_payload":1048576,"proto":1}\r\n'
    cases = [
        case("nats-refused", TRANSIENT, run(lambda: connect(_free_port())), "nats-py connect to a closed port"),
        case("nats-no-responders", TRANSIENT, run(request_nobody),
             "nats-py request on the local NATS server to a subject nobody subscribes to"),
        case("nats-request-timeout", TRANSIENT, run(request_silent),
             "nats-py request on the local NATS server to a subscriber that never replies"),
        case("nats-max-payload", PERMANENT, run(too_big), "nats-py publish of a payload over the server's max"),
        case("nats-bad-subject", PERMANENT, run(bad_subject), "nats-py publish to an empty subject"),
    ]
    for name, line, label in [("auth", b"-ERR 'Authorization Violation'\r\n", PERMANENT),
                              ("max-connections", b"-ERR 'maximum connections exceeded'\r\n", TRANSIENT),
                              ("not-nats", b"SSH-2.0-OpenSSH_9.6\r\n", PERMANENT)]:
        listener, port = serve_lines(lambda line=line, name=name: info + line if name != "not-nats" else line,
                                     lambda received: b"")
        cases.append(case(f"nats-{name}", label, run(lambda port=port: connect(port)),
                          f"nats-py connect; the peer greets with {line.strip().decode()!r}"))
        listener.close()
    return cases


# -- FTP through ftplib, SSH/SFTP through paramiko -------------------------------------------------------

FTP_REPLIES = [  # (reply to the command under test, label)
    (b"421 Service not available, closing control connection.", TRANSIENT),
    (b"425 Can't open data connection.", TRANSIENT),
    (b"426 Connection closed; transfer aborted.", TRANSIENT),
    (b"450 Requested file action not taken. File unavailable (busy).", TRANSIENT),
    (b"451 Requested action aborted: local error in processing.", TRANSIENT),
    (b"452 Requested action not taken. Insufficient storage space in system.", TRANSIENT),
    (b"500 Syntax error, command unrecognized.", PERMANENT),
    (b"501 Syntax error in parameters or arguments.", PERMANENT),
    (b"502 Command not implemented.", PERMANENT),
    (b"530 Not logged in.", PERMANENT),
    (b"550 Requested action not taken. File unavailable (not found, no access).", PERMANENT),
    (b"552 Requested file action aborted. Exceeded storage allocation.", PERMANENT),
    (b"553 Requested action not taken. File name not allowed.", PERMANENT),
]


def ftp_cases() -> list[LibCase]:
    import ftplib

    def ftp_peer(reply: bytes, *, at_login: bool = False):
        def answer(line: bytes) -> bytes:
            if line.startswith(b"USER"):
                return reply + b"\r\n" if at_login else b"331 Password required.\r\n"
            if line.startswith(b"PASS"):
                return b"230 Logged in.\r\n"
            if line.startswith(b"TYPE"):
                return b"200 Type set.\r\n"
            return reply + b"\r\n"

        return serve_lines(lambda: b"220 corpus FTP ready.\r\n", answer)

    def fetch(port: int, timeout: float = 2):
        def run() -> None:
            with ftplib.FTP() as ftp:
                ftp.connect("127.0.0.1", port, timeout=timeout)
                ftp.login("pipeline", "secret")
                ftp.size("scan-0001.pdf")

        return run

    cases = []
    for reply, label in FTP_REPLIES:
        listener, port = ftp_peer(reply)
        code = reply[:3].decode()
        cases.append(case(f"ftp-{code}", label, fetch(port), f"ftplib login then SIZE; the FTP peer replies {code}"))
        listener.close()
    listener, port = ftp_peer(b"421 Too many connections (8) from this IP", at_login=True)
    cases.append(case("ftp-421-at-login", TRANSIENT, fetch(port), "ftplib login; the peer answers USER with 421"))
    listener.close()
    _, silent = _serve_raw(_silent)
    cases += [case("ftp-refused", TRANSIENT, fetch(_free_port()), "ftplib connect to a closed port"),
              case("ftp-no-banner", TRANSIENT, fetch(silent, 0.5), "ftplib connect; the peer never sends its banner")]
    return cases


def ssh_cases() -> list[LibCase]:
    import paramiko

    def connect(port: int):
        def run() -> None:
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            try:
                client.connect("127.0.0.1", port=port, username="u", password="p", timeout=1, banner_timeout=1,
                               auth_timeout=1, look_for_keys=False, allow_agent=False)
            finally:
                client.close()

        return run

    _, hangs_up = _serve_raw(_closes_at_once)
    _, ssh1 = _serve_raw(_replies(b"SSH-1.5-OpenSSH_2.1\r\n", read_first=False))
    return [case("ssh-refused", TRANSIENT, connect(_free_port()),
                 "paramiko SSHClient.connect to a closed port: NoValidConnectionsError holding the refusal in .errors"),
            case("ssh-hangs-up", TRANSIENT, connect(hangs_up),
                 "paramiko SSHClient.connect; the peer closes before its banner"),
            case("ssh-version-1", PERMANENT, connect(ssh1),
                 "paramiko SSHClient.connect to a peer whose banner speaks SSH 1.5 only")]


# -- a document store: pymongo -----------------------------------------------------------------------------

def _mongo_peer(error: dict | None):
    """Enough of MongoDB's OP_MSG protocol: ``hello`` answers as a primary; any other command gets ``error``."""
    import bson

    def reply(request_id: int, document: dict) -> bytes:
        body = struct.pack("<I", 0) + b"\x00" + bson.encode(document)
        return struct.pack("<iiii", 16 + len(body), 1, request_id, 2013) + body

    def handle(conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            while True:
                header = conn.recv(16, socket.MSG_WAITALL)
                if len(header) < 16:
                    return
                length, request_id, _, opcode = struct.unpack("<iiii", header)
                body = conn.recv(length - 16, socket.MSG_WAITALL)
                command = bson.decode(body[5:5 + struct.unpack("<i", body[5:9])[0]]) if opcode == 2013 else {}
                name = next(iter(command), "")
                if name.lower() in ("hello", "ismaster"):
                    conn.sendall(reply(request_id, {
                        "ok": 1.0, "isWritablePrimary": True, "helloOk": True, "maxWireVersion": 21,
                        "minWireVersion": 0, "maxBsonObjectSize": 16777216, "maxMessageSizeBytes": 48000000,
                        "maxWriteBatchSize": 100000, "localTime": bson.datetime.datetime.now(),
                        "logicalSessionTimeoutMinutes": 30, "connectionId": 1}))
                elif error is None:
                    return  # hang up mid-command
                else:
                    conn.sendall(reply(request_id, {"ok": 0.0, **error}))
        except OSError:
            pass
        finally:
            conn.close()

    return _serve_raw(handle)


MONGO_ERRORS = [  # (code, codeName, labels, label)
    (91, "ShutdownInProgress", [], TRANSIENT), (11600, "InterruptedAtShutdown", [], TRANSIENT),
    (189, "PrimarySteppedDown", [], TRANSIENT), (10107, "NotWritablePrimary", [], TRANSIENT),
    (262, "ExceededTimeLimit", [], TRANSIENT), (50, "MaxTimeMSExpired", [], TRANSIENT),
    (112, "WriteConflict", ["TransientTransactionError"], TRANSIENT),
    (9001, "SocketException", ["RetryableWriteError"], TRANSIENT),
    (16500, "RequestRateTooLarge", [], TRANSIENT),
    (11000, "DuplicateKey", [], PERMANENT), (13, "Unauthorized", [], PERMANENT), (2, "BadValue", [], PERMANENT),
    (26, "NamespaceNotFound", [], PERMANENT), (9, "FailedToParse", [], PERMANENT),
    (121, "DocumentValidationFailure", [], PERMANENT), (59, "CommandNotFound", [], PERMANENT),
]


def mongo_cases() -> list[LibCase]:
    import pymongo

    def command(port: int, **kwargs):
        def run() -> None:
            client = pymongo.MongoClient("127.0.0.1", port, serverSelectionTimeoutMS=800, connectTimeoutMS=800,
                                         socketTimeoutMS=1500, retryReads=False, retryWrites=False,
                                         directConnection=True, **kwargs)
            try:
                client.corpus.pages.insert_one({"page": 1})
            finally:
                client.close()

        return run

    cases = [case("mongo-refused", TRANSIENT, command(_free_port()),
                  "pymongo insert_one, server selection against a closed port: ServerSelectionTimeoutError")]
    for code, name, labels, label in MONGO_ERRORS:
        listener, port = _mongo_peer({"code": code, "codeName": name, "errmsg": f"corpus {name}",
                                      **({"errorLabels": labels} if labels else {})})
        cases.append(case(f"mongo-{code}-{name}", label, command(port),
                          f"pymongo insert_one; the OP_MSG peer answers ok:0 code {code} {name} labels {labels}"))
        listener.close()
    listener, port = _mongo_peer(None)
    cases.append(case("mongo-hangs-up", TRANSIENT, command(port), "pymongo insert_one; the peer hangs up mid-command"))
    listener.close()
    return cases


# -- OCR binaries and subprocesses -------------------------------------------------------------------------

def _script(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def ocr_cases(folder: Path) -> list[LibCase]:
    import pytesseract
    from PIL import Image

    image = Image.new("L", (40, 20), 255)
    version = 'if [ "$1" = "--version" ]; then echo "tesseract 5.3.0"; exit 0; fi\n'

    def ocr(binary: str, **kwargs):
        def run() -> None:
            pytesseract.pytesseract.tesseract_cmd = binary
            try:
                pytesseract.image_to_string(image, **kwargs)
            finally:
                pytesseract.pytesseract.tesseract_cmd = "tesseract"

        return run

    slow = _script(folder, "tesseract-slow", version + "sleep 5")
    no_lang = _script(folder, "tesseract-nolang", version + 'echo "Error opening data file ./xyz.traineddata" >&2\n'
                                                           'echo "Failed loading language \'xyz\'" >&2; exit 1')
    bad_image = _script(folder, "tesseract-badimage", version + 'echo "Error in pixReadStream: Unknown format" >&2\n'
                                                               'echo "Image file cannot be read!" >&2; exit 1')
    return [
        case("ocr-not-installed", PERMANENT, ocr(str(folder / "no-such-tesseract")),
             "pytesseract image_to_string with tesseract_cmd naming a missing binary: TesseractNotFoundError"),
        case("ocr-timeout", TRANSIENT, ocr(slow, timeout=0.5),
             "pytesseract image_to_string timeout 0.5 s; the stand-in tesseract sleeps 5 s"),
        case("ocr-no-language", PERMANENT, ocr(no_lang, lang="xyz"),
             "pytesseract image_to_string; the stand-in tesseract fails loading language xyz (exit 1)"),
        case("ocr-bad-image", PERMANENT, ocr(bad_image),
             "pytesseract image_to_string; the stand-in tesseract cannot read the image (exit 1)"),
    ]


def subprocess_cases(folder: Path) -> list[LibCase]:
    fails = _script(folder, "pdftoppm-corrupt", 'echo "Syntax Error: Couldn\'t find trailer dictionary" >&2; exit 99')
    return [
        case("subprocess-timeout", TRANSIENT,
             lambda: subprocess.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5),
             "subprocess.run of a python that sleeps 5 s, timeout 0.5 s: TimeoutExpired"),
        case("subprocess-missing", PERMANENT, lambda: subprocess.run([str(folder / "no-such-ocr")]),
             "subprocess.run of a binary that does not exist"),
        case("subprocess-not-executable", PERMANENT, lambda: subprocess.run([str(folder)]),
             "subprocess.run of a directory"),
        case("subprocess-failed", PERMANENT, lambda: subprocess.run([fails], check=True, capture_output=True),
             "subprocess.run check=True of a stand-in pdftoppm that exits 99 on a corrupt PDF"),
    ]


# -- output parsers -------------------------------------------------------------------------------------------

def parser_cases() -> list[LibCase]:
    import tomllib
    import xml.etree.ElementTree as ElementTree

    import jsonschema
    import orjson
    import pydantic
    import yaml

    class Invoice(pydantic.BaseModel):
        total: float
        currency: str

    cut = '{"total": 12.5, "currency": "EU'
    return [
        case("parse-json-cut", PERMANENT, lambda: json.loads(cut), "json.loads of a model answer cut mid-string"),
        case("parse-json-prose", PERMANENT, lambda: json.loads("Sure! Here is the JSON: {}"),
             "json.loads of an answer that starts with prose"),
        case("parse-orjson", PERMANENT, lambda: orjson.loads(cut), "orjson.loads of a cut answer"),
        case("parse-pydantic-missing", PERMANENT, lambda: Invoice.model_validate_json('{"total": 1}'),
             "pydantic model_validate_json with a field missing"),
        case("parse-pydantic-type", PERMANENT, lambda: Invoice.model_validate({"total": "many", "currency": "EUR"}),
             "pydantic model_validate with a total that is not a number"),
        case("parse-pydantic-json", PERMANENT, lambda: Invoice.model_validate_json(cut),
             "pydantic model_validate_json of a cut answer"),
        case("parse-jsonschema", PERMANENT,
             lambda: jsonschema.validate({"total": "x"}, {"properties": {"total": {"type": "number"}}}),
             "jsonschema.validate of an answer against its schema"),
        case("parse-yaml", PERMANENT, lambda: yaml.safe_load("total: [1, 2\ncurrency: EUR"),
             "yaml.safe_load of an unclosed flow sequence"),
        case("parse-toml", PERMANENT, lambda: tomllib.loads("total = \n"), "tomllib.loads of a key without value"),
        case("parse-xml", PERMANENT, lambda: ElementTree.fromstring("<invoice><total>1</invoice>"),
             "ElementTree.fromstring of mismatched tags"),
    ]


# -- this machine's resources ----------------------------------------------------------------------------------

def _without_file_descriptors(calls: dict[str, Callable[[], object]]) -> dict[str, BaseException]:
    """Run each call with every file descriptor this process may have in use (the soft limit lowered to
    just above the highest open one, the gaps below it filled), then give the descriptors back. The gaps are
    filled again before each call: a call before it may have freed one (a failed client's socket closed by the
    garbage collector, another thread's), and the next call then found it (a clean-clone CI run: sqlite3
    opened its file on one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    found: dict[str, BaseException] = {}

    def use_up() -> None:
        gc.collect()  # what an earlier call left for the collector is closed now, not during the next call
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE, exc
                return

    resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(n) for n in os.listdir("/proc/self/fd")) + 1, hard))
    try:
        for name, call in calls.items():
            use_up()
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - collecting exceptions is the point
                found[name] = exc
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    missing = set(calls) - set(found)
    assert not missing, f"raised nothing without file descriptors: {missing}"
    return found


def resource_cases(folder: Path) -> list[LibCase]:
    import ftplib

    import httpx
    import pika
    import requests

    http = ScriptedHTTP()
    http.script(200, "{}")
    try:
        calls = {
            "emfile-open": (lambda: (folder / "page.txt").open("w").close(), "open() for writing"),
            "emfile-socket": (lambda: socket.socket(), "socket.socket()"),
            "emfile-pipe": (lambda: os.pipe(), "os.pipe()"),
            "emfile-subprocess": (lambda: subprocess.run(["true"]), "subprocess.run(['true'])"),
            "emfile-requests": (lambda: requests.get(http.url, timeout=2),
                                "requests.get to a live local server: urllib3's NewConnectionError, a connect "
                                "timeout subclass, wraps the EMFILE"),
            "emfile-httpx": (lambda: httpx.get(http.url, timeout=2), "httpx.get to a live local server"),
            "emfile-urllib": (lambda: __import__("urllib.request").request.urlopen(http.url, timeout=2),
                              "urllib.request.urlopen of a live local server"),
            "emfile-ftplib": (lambda: ftplib.FTP("127.0.0.1", timeout=2), "ftplib.FTP connect"),
            "emfile-pika": (lambda: pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", 5672, connection_attempts=1, socket_timeout=1)), "pika BlockingConnection to RabbitMQ"),
            "emfile-sqlite": (lambda: sqlite3.connect(folder / "journal.db").execute("create table t (x)"),
                              "sqlite3.connect of a new database file"),
        }
        raised_here = _without_file_descriptors({name: call for name, (call, _) in calls.items()})
    finally:
        http.close()
    cases = [LibCase(name, PERMANENT, raised_here[name],
                     f"{how}, with the process's file descriptors used up (RLIMIT_NOFILE lowered): EMFILE")
             for name, (_, how) in calls.items()]

    def write_full() -> None:
        with open("/dev/full", "w") as sink:
            sink.write("page text")

    import shutil

    import numpy

    source = folder / "scan.bin"
    source.write_bytes(b"x" * 4096)
    cases += [
        case("enospc-write", PERMANENT, write_full, "write and flush to /dev/full: ENOSPC, this disk is full"),
        case("enospc-copy", PERMANENT, lambda: shutil.copyfile(source, "/dev/full"), "shutil.copyfile to /dev/full"),
        case("enomem-mmap", PERMANENT, lambda: mmap.mmap(-1, 1 << 46), "an anonymous mmap of 64 TiB: ENOMEM"),
        case("memoryerror-bytes", PERMANENT, lambda: bytearray(1 << 62), "bytearray(2**62): MemoryError"),
        case("memoryerror-numpy", PERMANENT, lambda: numpy.empty((1 << 42,)),
             "numpy.empty of 4 Ti floats: numpy's MemoryError"),
    ]
    return cases


def build_local_generic_corpus(folder: Path) -> list[LibCase]:
    return [c for cases in (pika_cases(), mqtt_cases(), nats_cases(), ftp_cases(), ssh_cases(), mongo_cases(),
                            ocr_cases(folder), subprocess_cases(folder), parser_cases(), resource_cases(folder))
            for c in cases]
