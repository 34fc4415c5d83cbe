"""A TCP port on 127.0.0.1 that a test turns from refusing, to never answering, to a relay of a real server.

Bound but not listening, the port refuses connections (a database that is down). :meth:`blackhole` makes it
listen without ever accepting: the kernel completes the handshake and the client waits for an answer that
never comes (a database host that stopped answering). :meth:`forward_to` relays every connection, the ones
already waiting included, to a real server (the database is back).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpGate:
    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._listening = False
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []

    def blackhole(self) -> None:
        if not self._listening:
            self._listener.listen(64)
            self._listening = True

    def forward_to(self, port: int) -> None:
        self.blackhole()
        threading.Thread(target=self._accept, args=(port,), daemon=True).start()

    def _accept(self, port: int) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
