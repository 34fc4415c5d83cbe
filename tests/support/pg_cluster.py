"""A private PostgreSQL cluster for tests that restart or stop the server.

``initdb`` and ``pg_ctl`` from the installed PostgreSQL, on a free port bound to
127.0.0.1, in a temporary folder owned by ``postgres`` (initdb refuses to run as root).
Stopping it never touches the shared server on 5432.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("RECOVERY_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateCluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rx-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(PG_BIN / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)

    def init(self) -> PrivateCluster:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.root}'\n"
                "fsync = off\nmax_connections = 100\n"
            )
        return self

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "-t", "120", "restart",
                         check=False)
        if done.returncode:
            raise RuntimeError(f"pg_ctl restart failed: {done.stdout} {done.stderr}")
        self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def postmaster_pid(self) -> int:
        """The postmaster's pid: SIGSTOP it and new connections hang in the listen backlog (the
        kernel completes their handshake, nothing answers), while sessions already open go on."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
