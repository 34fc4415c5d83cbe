"""The namespace-host harness's subnets: test workers that make networks at the same moment never share one."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import netns
from recovery_ext._processes import process_key, this_process

WORKERS = 6


def _reserve_after(barrier: Any, folder: str, out: Any) -> None:
    netns.RESERVATIONS = Path(folder)
    barrier.wait()
    out.put(netns._reserve_subnet(this_process()))
    barrier.wait()  # a holder that has exited frees its subnet: every one holds on until all have reserved


@pytest.fixture
def reservations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "subnets"
    monkeypatch.setattr(netns, "RESERVATIONS", folder)
    return folder


def test_processes_reserving_at_once_get_different_subnets(reservations: Path) -> None:
    spawn = multiprocessing.get_context("fork")
    barrier, out = spawn.Barrier(WORKERS, timeout=60), spawn.Queue()  # a broken worker never hangs the rest
    workers = [spawn.Process(target=_reserve_after, args=(barrier, str(reservations), out), daemon=True)
               for _ in range(WORKERS)]
    for worker in workers:
        worker.start()
    subnets = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(60)
    assert len(set(subnets)) == WORKERS, subnets
    assert all(worker.exitcode == 0 for worker in workers)


def test_a_dead_process_reservation_is_taken_over_and_a_live_one_is_not(reservations: Path) -> None:
    first = netns._reserve_subnet(this_process())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (reservations / str(first)).write_text(process_key(int(dead)))  # as if a worker that reserved it was killed
    assert netns._reserve_subnet(this_process()) == first
    assert netns._reserve_subnet(this_process()) != first      # this process's own reservation holds


def test_releasing_leaves_another_process_reservation(reservations: Path) -> None:
    mine = f"{this_process()} net1"
    subnet = netns._reserve_subnet(mine)
    netns._release_subnet(subnet, mine)
    assert not (reservations / str(subnet)).exists()
    for since in (process_key(os.getppid()), f"{this_process()} net2"):  # another process, another network
        (reservations / str(subnet)).write_text(since)
        netns._release_subnet(subnet, mine)
        assert (reservations / str(subnet)).read_text() == since
