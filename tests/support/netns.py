"""Hosts as Linux network namespaces, for tests that kill a whole host or cut it off the network.

A :class:`Network` is one bridge in the root namespace with a private /24 (default
``10.231.<n>.0/24``, the bridge at ``.1``) and one namespace per :class:`Host`, joined to the
bridge by a veth pair (``eth0`` inside, the host at ``.10 + i``). Servers the hosts need
(PostgreSQL, Redis) listen on 127.0.0.1 and on the bridge address only, so a host reaches them
over its own link and nothing else: setting the host's bridge port down cuts it off (packets
vanish; its TCP sessions hang, as on a real partition), setting it up reconnects it.

:meth:`Host.kill` is a host loss: its link goes down first (so no FIN or RST leaves it, as when
a machine loses power), then every process in the namespace gets ``kill -9``.

Needs root and ``ip`` (iproute2); a missing prerequisite raises with a clear message.
Everything created is removed by :meth:`Network.destroy` (namespaces, veths, the bridge).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
import contextlib
import fcntl
import tempfile

from recovery_ext._processes import is_alive, this_process

PREFIX = "rxc"
# Which 10.231.N.0/24 each live Network holds: a file per subnet naming its process (its process key), written
# under an exclusive lock, so test workers that make networks at the same moment never pick the same subnet.
RESERVATIONS = Path(tempfile.gettempdir()) / "rx-netns-subnets"


def _ip(*args: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return done


def require_netns() -> None:
    """Fail (never skip) when the machine cannot make namespace hosts."""
    if shutil.which("ip") is None:
        raise RuntimeError("namespace hosts need the `ip` command (iproute2)")
    if os.geteuid() != 0:
        raise RuntimeError("namespace hosts need root (ip netns add)")


def _used_subnets() -> set[int]:
    out = _ip("-4", "-o", "addr", "show").stdout
    used = set()
    for line in out.splitlines():
        for part in line.split():
            if part.startswith("10.231."):
                used.add(int(part.split(".")[2]))
    return used


def _reserve_subnet(holder: str) -> int:
    """A subnet no link holds and no live process reserved, reserved for ``holder`` (this process's key, then a
    name of its own) until released."""
    RESERVATIONS.mkdir(exist_ok=True)
    with open(RESERVATIONS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        taken = _used_subnets()
        for entry in RESERVATIONS.glob("[0-9]*"):
            if is_alive(entry.read_text().split(" ")[0]):  # a process key: a reused pid never passes for its holder
                taken.add(int(entry.name))
            else:
                entry.unlink(missing_ok=True)
        free = [n for n in range(1, 250) if n not in taken]
        if not free:
            raise RuntimeError("no free 10.231.N.0/24 subnet for namespace hosts")
        (RESERVATIONS / str(free[0])).write_text(holder)
        return free[0]


def _release_subnet(subnet: int, holder: str) -> None:
    """Drop ``holder``'s reservation of ``subnet`` (never another's, if another reserved it since)."""
    entry = RESERVATIONS / str(subnet)
    with open(RESERVATIONS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if entry.read_text() == holder:
                entry.unlink()


class Host:
    def __init__(self, network: Network, index: int) -> None:
        self.network = network
        self.index = index
        self.name = f"{PREFIX}{network.tag}h{index}"       # the namespace
        self.port = f"{PREFIX}{network.tag}p{index}"       # root side of the veth, a port of the bridge
        self.address = f"{network.base}.{10 + index}"
        self.procs: list[subprocess.Popen] = []

    def create(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.port, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        _ip("link", "set", self.port, "master", self.network.bridge)
        _ip("link", "set", self.port, "up")
        _ip("addr", "add", f"{self.address}/24", "dev", "eth0", netns=self.name)
        _ip("link", "set", "lo", "up", netns=self.name)
        _ip("link", "set", "eth0", "up", netns=self.name)

    # -- processes -----------------------------------------------------------------------------

    def popen(self, argv: list[str], *, env: dict[str, str], log: Path, cwd: str | None = None) -> subprocess.Popen:
        """Start ``argv`` inside this host (its own session, output to ``log``)."""
        out = open(log, "ab")  # noqa: SIM115 - handed to the child, closed here once it has it
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], env=env, cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        done = _ip("netns", "pids", self.name, check=False)
        return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []

    def kill(self) -> list[int]:
        """A host loss: the link goes down, then every process in the namespace is killed with -9."""
        self.cut()
        killed: list[int] = []
        deadline = time.monotonic() + 30
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {pids} of host {self.name} survived kill -9")
            time.sleep(0.05)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        return sorted(set(killed))

    # -- the link --------------------------------------------------------------------------------

    def cut(self) -> None:
        """Cut this host off: its bridge port goes down, so its packets vanish (no error, no reset)."""
        _ip("link", "set", self.port, "down")

    def reconnect(self) -> None:
        _ip("link", "set", self.port, "up")

    def link_up(self) -> bool:
        return "state UP" in _ip("link", "show", self.port).stdout or ",UP" in _ip("link", "show", self.port).stdout

    def destroy(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        _ip("link", "del", self.port, check=False)
        _ip("netns", "del", self.name, check=False)


class Network:
    """A bridge with a private /24 and namespace hosts on it."""

    def __init__(self, hosts: int) -> None:
        require_netns()
        self.tag = uuid.uuid4().hex[:4]
        self.holder = f"{this_process()} {self.tag}"  # a network of its own, not only this process's
        self.subnet = _reserve_subnet(self.holder)
        self.base = f"10.231.{self.subnet}"
        self.gateway = f"{self.base}.1"                    # the bridge: where the servers listen
        self.bridge = f"{PREFIX}{self.tag}br"
        self.hosts = [Host(self, i) for i in range(hosts)]
        self._created = False

    def create(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._created = True
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                host.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def add_host(self) -> Host:
        host = Host(self, len(self.hosts))
        self.hosts.append(host)
        host.create()
        return host

    def destroy(self) -> None:
        for host in self.hosts:
            host.destroy()
        if self._created:
            _ip("link", "del", self.bridge, check=False)
            self._created = False
        _release_subnet(self.subnet, self.holder)

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc_info) -> None:
        self.destroy()


def leftovers() -> list[str]:
    """Namespaces of this harness that still exist (a test asserts none outlive it)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]
