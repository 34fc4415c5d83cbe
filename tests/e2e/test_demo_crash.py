"""`make demo-crash` checks its own outcome, and passes on a busy machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recovery_pipelines.demo_crash import Outcome
from recovery_pipelines.devserver import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_check_fails_when_a_kill_did_not_happen_a_pipeline_failed_or_a_kill_resumed_twice():
    good = Outcome(killed={"ontology_extraction": 1, "ocr_documents": 2},
                   final_status={"ontology_extraction": "completed", "ocr_documents": "completed"},
                   resumes={"ontology_extraction": 1, "ocr_documents": 1})
    assert good.problems() == []
    no_kill = Outcome(killed={"ocr_documents": 2}, final_status=dict(good.final_status), resumes={"ocr_documents": 1})
    assert no_kill.problems() == [
        "ontology_extraction: no run worker was killed (the run never reached the kill point)"
    ]
    failed = Outcome(killed=dict(good.killed), final_status={**good.final_status, "ocr_documents": "failed"},
                     resumes=dict(good.resumes))
    assert failed.problems() == ["ocr_documents: pipeline ended failed, not completed"]
    twice = Outcome(killed=dict(good.killed), final_status=dict(good.final_status),
                    resumes={**good.resumes, "ontology_extraction": 3})
    assert twice.problems() == ["ontology_extraction: one kill led to 3 resume runs, expected exactly 1"]
    extra = Outcome(killed=dict(good.killed), final_status=dict(good.final_status), resumes=dict(good.resumes),
                    runs={"ontology_extraction": 2, "ocr_documents": 3})
    assert extra.problems() == ["ocr_documents: 1 run(s) beside the first run and its resume"]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_demo_crash_passes_its_own_check_on_a_busy_machine(tmp_path, cpu_hog):
    port = free_port()
    env = {**os.environ, "RECOVERY_DEMO_CRASH_DIR": str(tmp_path / "demo-crash"), "PORT": str(port)}
    env.pop("RECOVERY_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "recovery_pipelines.demo_crash"], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=580)
    output = done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "CHECK PASSED" in done.stdout and "kill -9 run worker pid" in done.stdout
    assert "orphan detected (owner_run_dead)" in done.stdout
    # the UI ran on PORT, and how to browse the runs afterwards names the same port
    assert f"Dagster UI: http://127.0.0.1:{port} " in done.stdout
    assert f"dagster-webserver -h 127.0.0.1 -p {port} " in done.stdout
    # every command it prints to inspect the outcome runs as pasted
    commands = []
    for line in done.stdout.split("Inspect them (one command a line):\n", 1)[1].splitlines():
        if not line.startswith("  "):
            break
        commands.append(line.strip())
    assert len(commands) == 5 and commands[0].endswith(" status")
    for command in commands:
        pasted = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert pasted.returncode == 0, (command, pasted.stderr)
    assert "completed" in subprocess.run(["bash", "-c", commands[1]], capture_output=True, text=True,
                                         timeout=60).stdout


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_batch_part_narrates_without_dagster_debug_lines_or_a_missing_config_warning(tmp_path):
    # Its resume runs in the demo's own process: Dagster's step-by-step DEBUG lines and its warning about
    # a throw-away instance without dagster.yaml would drown the narration a newcomer reads.
    env = {**os.environ, "RECOVERY_DEMO_CRASH_DIR": str(tmp_path / "demo-crash"), "RECOVERY_DEMO_ONLY": "batch"}
    env.pop("RECOVERY_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "recovery_pipelines.demo_crash"], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=280)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "CHECK PASSED: the resume re-attached to the pending batch" in done.stdout
    assert "re-attached to openai-batch job" in output  # the resume's own INFO line stays
    assert " - DEBUG - " not in output and "No dagster instance configuration file" not in output, output
