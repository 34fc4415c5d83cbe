"""A whole distributed Dagster + Celery deployment on one machine, with hosts as network namespaces.

- **servers** (root namespace, listening on 127.0.0.1 and the bridge address only): a private
  PostgreSQL cluster holding Dagster's storage (database ``dagster``) and the application tables
  (``app``), and a private Redis (broker: db 0, result backend: db 1) with an append-only file, so
  a restart keeps queued tasks and stored results, as a production broker would;
- **control host** (root namespace): ``dagster dev`` (webserver, daemon, the code server the
  sensors run in), launching runs through dagster-celery's ``CeleryRunLauncher`` onto the
  ``runs`` queue;
- **run host** (namespace): a Celery worker for the ``runs`` queue: the run workers;
- **worker hosts** (namespaces): Celery workers for dagster-celery's ``dagster`` queue: the steps.

Every host reaches PostgreSQL and Redis only over its own veth, so :class:`netns.Host` can kill
it (kill -9 of everything in it, its link down first) or cut it off and reconnect it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg
from netns import Host, Network, leftovers
from pg_cluster import PrivateCluster, free_port

from recovery_pipelines.devserver import DagsterDev, wait_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEPLOY = ROOT / "deploy" / "celery"
BIN = Path(sys.executable).parent
RUN_QUEUE = "runs"
STEP_QUEUE = "dagster"


class NetPostgres(PrivateCluster):
    """A private PostgreSQL listening on 127.0.0.1 and the bridge address, trusting the private subnet."""

    def __init__(self, gateway: str, subnet: str) -> None:
        super().__init__()
        self.gateway = gateway
        self.subnet = subnet

    def init(self) -> NetPostgres:
        super().init()
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1,{self.gateway}'\nmax_connections = 300\n"
                       "tcp_keepalives_idle = 5\ntcp_keepalives_interval = 2\ntcp_keepalives_count = 3\n")
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {self.subnet} trust\n")
        return self

    def url_at(self, address: str, database: str, scheme: str = "postgresql") -> str:
        return f"{scheme}://postgres@{address}:{self.port}/{database}"


class Redis:
    """A private redis-server with an append-only file (a restart keeps tasks and results)."""

    def __init__(self, gateway: str | None = None) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("the Celery tests need redis-server (apt-get install redis-server)")
        self.gateway = gateway
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rx-redis-"))
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - redis writes to it until it stops
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", " ".join(filter(None, ["127.0.0.1", self.gateway])),
             "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir), "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for(self.ping, timeout=30, what=f"redis on port {self.port}")

    def ping(self) -> bool:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1).ping()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(30)
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def url_at(self, address: str, db: int) -> str:
        return f"redis://{address}:{self.port}/{db}"

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class CeleryDeployment:
    def __init__(self, *, worker_hosts: int = 2, run_concurrency: int = 4, env: dict[str, str] | None = None,
                 defs_file: Path = HERE / "celery_defs.py",
                 start_servers: Callable[[str], dict[str, str]] | None = None) -> None:
        """``start_servers(gateway)``: more servers the hosts reach (started once the bridge exists, listening
        on 127.0.0.1 or the bridge address ``gateway`` only); returns environment for every process."""
        self.worker_count = worker_hosts
        self.start_servers = start_servers
        self.run_concurrency = run_concurrency
        self.extra_env = dict(env or {})
        self.defs_file = defs_file
        self.net: Network | None = None
        self.pg: NetPostgres | None = None
        self.redis: Redis | None = None
        self.dev: DagsterDev | None = None
        self.home = Path(tempfile.mkdtemp(prefix="rx-celery-home-"))
        self.logs = self.home / "host-logs"
        self.workers: dict[str, subprocess.Popen] = {}
        self._saved_env: dict[str, str | None] = {}

    # -- set-up ----------------------------------------------------------------------------------

    def start(self) -> CeleryDeployment:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.net = Network(hosts=1 + self.worker_count).create()
        gw = self.net.gateway
        self.pg = NetPostgres(gw, f"{self.net.base}.0/24").init()
        self.pg.start()
        with psycopg.connect(self.pg.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE dagster")
            conn.execute("CREATE DATABASE app")
        self.redis = Redis(gw)
        self.redis.start()
        if self.start_servers is not None:
            self.extra_env.update(self.start_servers(gw))
        self.write_instance_yaml()
        self.migrate_app()
        self.start_worker(self.run_host, queue=RUN_QUEUE, concurrency=self.run_concurrency)
        for host in self.worker_hosts:
            self.start_worker(host)
        self.wait_workers()
        control = self.env_at("127.0.0.1", "control")
        # this process reads Dagster's storage too (DagsterDev.instance): the control host's view
        self._saved_env = {k: os.environ.get(k) for k in ("DAGSTER_PG_URL",)}
        os.environ["DAGSTER_PG_URL"] = control["DAGSTER_PG_URL"]
        self.dev = DagsterDev(self.defs_file, self.home, control)
        self.dev.start(timeout=300)

    @property
    def run_host(self) -> Host:
        return self.net.hosts[0]

    @property
    def worker_hosts(self) -> list[Host]:
        return self.net.hosts[1:]

    def host_named(self, name: str) -> Host:
        return next(h for h in self.net.hosts if h.name == name)

    def env_at(self, address: str, host_name: str) -> dict[str, str]:
        """The environment of a process on a host that reaches the servers at ``address``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERY_", "DAGSTER_", "CELERY_E2E"))}
        env.update({
            "DAGSTER_HOME": str(self.home),
            "DAGSTER_PG_URL": self.pg.url_at(address, "dagster", scheme="postgresql+psycopg2"),
            "RECOVERY_DATABASE_URL": self.pg.url_at(address, "app"),
            "RECOVERY_CELERY_BROKER": self.redis.url_at(address, 0),
            "RECOVERY_CELERY_BACKEND": self.redis.url_at(address, 1),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
            "RX_HOST": host_name,
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    def write_instance_yaml(self) -> None:
        """The shipped several-machines instance config (CeleryRunLauncher, run workers on queue ``runs``)."""
        shutil.copy(DEPLOY / "dagster.multi-host.yaml", self.home / "dagster.yaml")

    def migrate_app(self) -> None:
        from recovery_ext import RecoveryStore

        store = RecoveryStore(self.pg.url_at("127.0.0.1", "app"))
        store.migrate()
        store.close()

    def worker_name(self, host: Host) -> str:
        return f"w-{host.name}@{host.name}"

    def start_worker(self, host: Host, *, queue: str = STEP_QUEUE, concurrency: int = 1) -> subprocess.Popen:
        argv = [str(BIN / "celery"), "-A", "recovery_pipelines.celery_app", "worker", "-Q", queue,
                "-c", str(concurrency), "-n", self.worker_name(host), "--without-gossip", "--without-mingle",
                "-l", "INFO"]
        proc = host.popen(argv, env=self.env_at(self.net.gateway, host.name), log=self.logs / f"{host.name}.log",
                          cwd=str(ROOT))
        self.workers[host.name] = proc
        return proc

    def celery_app(self):
        from celery import Celery

        return Celery("probe", broker=self.redis.url_at("127.0.0.1", 0), backend=self.redis.url_at("127.0.0.1", 1))

    def wait_workers(self, hosts: list[Host] | None = None, timeout: float = 120) -> None:
        hosts = hosts if hosts is not None else self.net.hosts
        app = self.celery_app()
        names = {self.worker_name(h) for h in hosts}

        def all_answer() -> bool:
            answered = set()
            for reply in app.control.ping(destination=sorted(names), timeout=1.0) or []:
                answered.update(reply)
            return names <= answered

        wait_for(all_answer, timeout=timeout, interval=0.5, what=f"Celery workers {sorted(names)} to answer a ping")

    # -- tear-down -------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.dev is not None:
            self.dev.stop()
            if os.environ.get("RX_KEEP_DEV_LOG"):
                shutil.copytree(self.home, os.environ["RX_KEEP_DEV_LOG"], dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("storage", "*.sock"))
        if self.net is not None:
            self.net.destroy()
        if self.redis is not None:
            self.redis.destroy()
        if self.pg is not None:
            self.pg.destroy()
        shutil.rmtree(self.home, ignore_errors=True)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def app_url(self) -> str:
        return self.pg.url_at("127.0.0.1", "app")


@contextmanager
def module_deployment(heartbeat_interval: float, heartbeat_timeout: float, sensor_interval: float,
                      **kwargs) -> Iterator[CeleryDeployment]:
    """A started deployment with short liveness settings, for a test module; no namespace host outlives it."""
    d = CeleryDeployment(**kwargs, env={
        "CELERY_E2E_HEARTBEAT_INTERVAL": str(heartbeat_interval),
        "CELERY_E2E_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
        "CELERY_E2E_SENSOR_INTERVAL": str(int(sensor_interval)),
    })
    d.start()
    try:
        yield d
    finally:
        d.stop()
        assert not [n for n in leftovers() if d.net.tag in n], "namespace hosts outlived the module"


def signal_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


if __name__ == "__main__":  # a manual smoke: bring the deployment up, run one job, tear it down
    dep = CeleryDeployment().start()
    try:
        run_id = dep.dev.launch("celery_items_job", {})
        print("launched", run_id, flush=True)
        run = dep.dev.wait_run(run_id, timeout=float(os.environ.get("SMOKE_TIMEOUT", "240")))
        print("status", run.status, flush=True)
    except BaseException:
        for f in sorted(dep.logs.glob("*.log")):
            print("=====", f.name, "\n", f.read_text()[-6000:])
        raise
    finally:
        if os.environ.get("SMOKE_KEEP"):
            print(f"keeping the deployment for {os.environ['SMOKE_KEEP']} s (home: {dep.home})", flush=True)
            time.sleep(float(os.environ["SMOKE_KEEP"]))
        dep.stop()
