"""A real Prometheus server (Debian's ``prometheus``) scrapes the exporter; PromQL sees a crash and its resume."""

from __future__ import annotations

from recovery_ext import RecoveryStore
from recovery_ext._store.observability import RECLAIM_CAUSES

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from observe_scenario import crash_and_resume, stand_in

from recovery_pipelines.devserver import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def running(cmd: list[str], log: Path, **kw) -> Iterator[subprocess.Popen]:
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kw)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def exporter(db_url: str, tmp_path: Path) -> Iterator[str]:
    """``recovery-ext metrics serve`` on a free port; yields its host:port."""
    log = tmp_path / "exporter.log"
    cmd = [sys.executable, "-m", "recovery_ext._cli", "--database-url", db_url, "metrics", "serve",
           "--host", "127.0.0.1", "--port", "0"]
    with running(cmd, log, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        found = wait_for(lambda: proc.poll() is None and re.search(r"127\.0\.0\.1:\d+", log.read_text()),
                         timeout=30, what=f"the exporter to listen ({log})")
        yield found.group(0)


@contextmanager
def prometheus(target: str, tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping ``target`` every second, its storage in ``tmp_path``; yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the prometheus binary is required (Debian package `prometheus`; .ci/run installs it)")
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: recovery\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
                      f"    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with running(cmd, tmp_path / "prometheus.log", cwd=tmp_path) as proc:
        wait_for(lambda: proc.poll() is None and requests.get(f"{base}/-/ready", timeout=2).ok, timeout=60,
                 what="prometheus to be ready")
        yield base


def query(base: str, promql: str) -> dict[tuple, float]:
    """An instant PromQL query over the HTTP API: {sorted labels without job/instance: value}."""
    body = requests.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert body["status"] == "success", body
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("job", "instance", "__name__"))):
            float(r["value"][1]) for r in body["data"]["result"]}


@pytest.fixture
def store(db_url):
    """This module's store is the test's own, on each database (not the e2e folder's `dagster dev` store)."""
    s = RecoveryStore(db_url)
    s.migrate()
    yield s
    s.close()


def test_promql_returns_the_reclaim_and_the_tokens_after_a_crash_and_its_resume(store, db_url, tmp_path):
    with exporter(db_url, tmp_path) as target, prometheus(target, tmp_path) as base:
        wait_for(lambda: query(base, 'up{job="recovery"}') == {(): 1.0}, timeout=30, what="the first scrape")
        # every cause is a series from the first scrape, reading 0 until it happens
        before = query(base, "recovery_reclaims_total")
        assert {dict(labels)["cause"] for labels in before} == set(RECLAIM_CAUSES)
        assert set(before.values()) == {0.0}
        with stand_in() as provider:
            crash = crash_and_resume(store, items_before=3, items_after=2, provider=provider)

        # The resume's last write is its pipeline's completion: until a scrape after it, Prometheus holds the state
        # of the scrape before (taken while the resume ran: its reclaim counted, the pipeline still running).
        completed = (("dagster_job", "ontology"), ("deployment", "default"), ("status", "completed"))
        wait_for(lambda: query(base, 'recovery_pipelines{status="completed"}').get(completed) == 1.0
                 and query(base, "sum(recovery_provider_calls_total)") == {(): float(provider.calls)},
                 timeout=30, what="a scrape after the resume ended, in Prometheus")
        heartbeat = (("cause", "heartbeat"),)
        reclaims = query(base, "sum by (cause) (recovery_reclaims_total)")
        assert {labels: n for labels, n in reclaims.items() if n} == {heartbeat: 1.0}
        resumes = query(base, "recovery_resume_runs_total")
        assert {labels: n for labels, n in resumes.items() if n} == {heartbeat: 1.0}
        assert query(base, 'recovery_items{status="completed"}') == {
            (("dagster_job", "ontology"), ("status", "completed")): float(crash.items_before + crash.items_after)}
        assert query(base, 'recovery_pipelines{status="completed"}') == {
            (("dagster_job", "ontology"), ("deployment", "default"), ("status", "completed")): 1.0}
        # The tokens the stand-in counted, every call paid (one of them twice: in flight at the crash).
        tokens = query(base, "sum by (type) (recovery_provider_tokens_total)")
        assert tokens == {(("type", "input"),): float(provider.tokens_in),
                          (("type", "output"),): float(provider.tokens_out)}
        assert query(base, "sum(recovery_provider_calls_total)") == {(): float(provider.calls)}
        assert query(base, "sum(recovery_provider_saved_calls_total)") == {(): float(len(crash.saved))}
        assert query(base, "sum(recovery_provider_wasted_tokens_total)") == {
            (): float(sum(c.tokens_in + c.tokens_out for c in crash.wasted))}
        # The counter went up from nothing to one during the scrapes Prometheus holds.
        assert query(base, "max_over_time(recovery_database_up[1m])") == {(): 1.0}
