"""``make demo-crash``: kill -9 the run workers of both jobs mid-way, watch them recover, check the outcome.

First it kills a run while its OpenAI batch (a local stand-in of the Batch API) is pending and resumes it:
the resume re-attaches to the batch, so the provider counts 1 submission and nothing paid twice
(recovery_pipelines/demo_batch.py; ``RECOVERY_DEMO_ONLY=batch`` runs only that part).

It starts `dagster dev` on 127.0.0.1 with a throw-away DAGSTER_HOME and SQLite tables under
var/demo-crash, short heartbeats and a 1 s sensor, launches the ontology and OCR jobs, kills each
run worker while it works, and prints every recovery event and run status change as it happens.

It exits non-zero when it could not kill a worker, when a pipeline did not complete, or when a
kill led to more than one resume run. In a terminal it then keeps the UI up until Ctrl-C; otherwise
(CI, a pipe) it prints the command that serves the same runs in the UI afterwards.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from dagster import DagsterRunStatus

from recovery_pipelines.ontology_schema import MIGRATIONS
from recovery_pipelines.demo_batch import run_batch_demo
from recovery_pipelines.devserver import BIN, DagsterDev, wait_for
from recovery_ext import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext.store import RecoveryStore

TERMINAL = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
EVENT_KINDS = ("pipeline_recovered", "pipeline_stuck", "pipeline_failed", "superseded_run_stopped",
               "item_reset", "item_dead")
JOBS = ("ontology_extraction", "ocr_documents")


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[+{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)


@dataclass
class Outcome:
    """What the demo checks at the end; ``problems`` empty means it showed what it promises."""

    killed: dict[str, int] = field(default_factory=dict)          # job -> killed run worker pid
    final_status: dict[str, str] = field(default_factory=dict)    # job -> pipeline status
    resumes: dict[str, int] = field(default_factory=dict)         # job -> resume runs created
    done_at_kill: dict[str, int] = field(default_factory=dict)    # job -> items finished when its worker died
    runs: dict[str, int] = field(default_factory=dict)            # job -> all its runs (first, resumes, others)

    def problems(self) -> list[str]:
        found = []
        for job in JOBS:
            if job not in self.killed:
                found.append(f"{job}: no run worker was killed (the run never reached the kill point)")
            if self.final_status.get(job) != "completed":
                found.append(f"{job}: pipeline ended {self.final_status.get(job, 'unknown')}, not completed")
            if job in self.killed and self.resumes.get(job, 0) != 1:
                found.append(f"{job}: one kill led to {self.resumes.get(job, 0)} resume runs, expected exactly 1")
            extra = self.runs.get(job, 0) - 1 - self.resumes.get(job, 0)
            if job in self.runs and extra:
                found.append(f"{job}: {extra} run(s) beside the first run and its resume")
        return found


def items_done(store: RecoveryStore, pipeline_id: int, node: str) -> int:
    with store.read_only() as conn:
        return conn.execute(text("SELECT count(*) FROM rx_node_items WHERE pipeline_id = :p AND node_name = :n"),
                            {"p": pipeline_id, "n": node}).scalar() or 0


class Watcher:
    """Prints recovery events and run status changes once each, whenever it is polled."""

    def __init__(self, t: Timeline, store: RecoveryStore, dev: DagsterDev) -> None:
        self.t, self.store, self.dev = t, store, dev
        self.last_event = 0
        self.run_status: dict[str, str] = {}
        self.pipeline_status: dict[int, str] = {}

    def poll(self, pipelines: dict[int, str]) -> None:
        for e in self.store.reports.recent_events(kinds=EVENT_KINDS, after_id=self.last_event):
            self.last_event = e["id"]
            self.t.say(describe_event(e, pipelines))
        for run in self.dev.runs():
            status = run.status.value
            if self.run_status.get(run.run_id) != status:
                self.run_status[run.run_id] = status
                role = (f"resume #{run.tags[TAG_RESUME_NUMBER]} of pipeline {run.tags[TAG_PIPELINE]}"
                        if TAG_RESUME_NUMBER in run.tags else "run")
                self.t.say(f"{run.job_name} {role} {run.run_id[:8]}: {status}")
        for pipeline_id, job in pipelines.items():
            status = self.store.pipelines.get_pipeline(pipeline_id).status
            if self.pipeline_status.get(pipeline_id) != status:
                self.pipeline_status[pipeline_id] = status
                self.t.say(f"pipeline {pipeline_id} ({job}): {status}")


def describe_event(e: dict, pipelines: dict[int, str]) -> str:
    p = e["payload"] or {}
    job = pipelines.get(e["pipeline_id"], p.get("job", ""))
    if e["kind"] == "pipeline_recovered":
        return (f"orphan detected ({p.get('cause')}) -> reclaimed pipeline {e['pipeline_id']} ({job}) as resume "
                f"#{p.get('resume_number')}; reset nodes: {', '.join(p.get('reset_nodes') or []) or '-'}")
    if e["kind"] == "superseded_run_stopped":
        return (f"superseded run {str(p.get('run_id'))[:8]} of pipeline {e['pipeline_id']}: {p.get('terminate')}"
                f"{', marked FAILURE' if p.get('marked_failed') else ''}")
    about = f" (pipeline {e['pipeline_id']})" if e["pipeline_id"] is not None else ""  # e.g. a whole scan's stats
    return f"{e['kind']}{about}: {p}"


def kill_run_worker(t: Timeline, dev: DagsterDev, run_id: str, job: str, progress: str) -> int:
    pid = wait_for(lambda: dev.run_worker_pid(run_id), timeout=60, what=f"the run worker pid of {job}")
    os.kill(pid, signal.SIGKILL)
    t.say(f"kill -9 run worker pid {pid} of {job}: {progress}")
    return pid


def browse_command(home: Path, app_url: str, root: Path, port: int) -> str:
    env = f"DAGSTER_HOME={shlex.quote(str(home))} RECOVERY_DATABASE_URL={shlex.quote(app_url)}"
    return (f"{env} {shlex.quote(str(BIN / 'dagster-webserver'))} -h 127.0.0.1 -p {port} "
            f"-w {shlex.quote(str(root / 'workspace.yaml'))}")


def inspect_commands(app_url: str, pipeline_ids: list[int]) -> list[str]:
    """One command a line, each pasted as printed."""
    cli = f"{shlex.quote(str(BIN / 'recovery-ext'))} --database-url {shlex.quote(app_url)}"
    return [f"{cli} status", *(f"{cli} pipelines show {pid}" for pid in pipeline_ids),
            *(f"{cli} report {pid} --html pipeline-{pid}.html" for pid in pipeline_ids)]


def port_from_env() -> int | None:
    """``PORT`` (what ``make demo-crash PORT=...`` passes), else None: any free port."""
    raw = os.environ.get("PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SystemExit(f"PORT must be a TCP port number, got {raw!r}")
    return int(raw)


def run_demo(root: Path, var: Path, t: Timeline, *, keep_ui: bool, timeout: float = 420,
             port: int | None = None) -> Outcome:
    shutil.rmtree(var, ignore_errors=True)
    home = var / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(root / "deploy" / "dagster.sqlite.yaml", home / "dagster.yaml")
    from recovery_pipelines.demo_llm import serve

    llm_server, llm_url = serve(latency=0.7)
    app_url = f"sqlite:///{var / 'recovery.sqlite3'}"
    env = {"RECOVERY_DATABASE_URL": app_url, "RECOVERY_DEMO_DIR": str(var / "inputs"),
           "RECOVERY_HEARTBEAT_INTERVAL": "1", "RECOVERY_ORPHAN_HEARTBEAT_THRESHOLD": "4",
           "RECOVERY_SENSOR_INTERVAL": "5", "RECOVERY_LLM_BASE_URL": llm_url, "RECOVERY_LLM_MODEL": "demo-llm"}
    os.environ.update(env)
    from recovery_pipelines.sample_data import prepare_demo

    prepare_demo(var / "inputs")
    outcome = Outcome()
    t.say("starting dagster dev on 127.0.0.1 (webserver, daemon, code server) ...")
    dev = DagsterDev(root / "workspace.yaml", home, env, workspace=True, port=port).start(timeout=240)
    store = RecoveryStore(app_url)
    try:
        store.migrate(MIGRATIONS)
        t.say(f"Dagster UI: http://127.0.0.1:{dev.port}  (application tables: {app_url})")
        runs = {job: dev.launch(job, {}) for job in JOBS}
        t.say(f"launched {', '.join(f'{job} run {run[:8]}' for job, run in runs.items())}")
        found = {job: wait_for(lambda r=run: store.pipelines.find_pipeline(r), timeout=180, what=f"the {job} pipeline")
                 for job, run in runs.items()}
        pipelines = {p.id: job for job, p in found.items()}
        ontology, ocr = found["ontology_extraction"], found["ocr_documents"]
        watcher = Watcher(t, store, dev)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            watcher.poll(pipelines)
            live = {job: store.pipelines.get_pipeline(p.id) for job, p in found.items()}
            first_run_owns = {job: p.status == "running" and p.owner == runs[job] for job, p in live.items()}
            if "ontology_extraction" not in outcome.killed and first_run_owns["ontology_extraction"]:
                done = items_done(store, ontology.id, "enrich_columns")
                if done >= 3:
                    outcome.done_at_kill["ontology_extraction"] = done
                    outcome.killed["ontology_extraction"] = kill_run_worker(
                        t, dev, runs["ontology_extraction"], "ontology_extraction",
                        f"enrich_columns had {done}/10 tables done")
            if "ocr_documents" not in outcome.killed and first_run_owns["ocr_documents"]:
                items = store.queue.list_items("ocr")
                done = sum(i.status == "completed" for i in items)
                if done:
                    outcome.killed["ocr_documents"] = kill_run_worker(
                        t, dev, runs["ocr_documents"], "ocr_documents", f"{done}/{len(items)} documents done")
            if all(p.status not in ("running",) for p in live.values()):
                break
            time.sleep(0.3)
        watcher.poll(pipelines)
        record_verdict(outcome, store, found, dev)
        watcher.poll(pipelines)
        summarize(t, store, ontology.id, outcome.done_at_kill.get("ontology_extraction"))
        problems = outcome.problems()
        for problem in problems:
            t.say(f"CHECK FAILED: {problem}")
        if not problems:
            t.say("CHECK PASSED: each kill -9 led to exactly one resume run and both pipelines completed")
        print(
            "\nInspect them (one command a line):\n  " + "\n  ".join(inspect_commands(app_url, [ontology.id, ocr.id]))
        )
        if keep_ui:
            print(f"The Dagster UI stays up at http://127.0.0.1:{dev.port} with these runs; Ctrl-C to stop.",
                  flush=True)
            try:
                while dev.proc is not None and dev.proc.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        else:
            browse_port = port or 3000
            print(f"Browse these runs in the Dagster UI afterwards (http://127.0.0.1:{browse_port}):\n  "
                  f"{browse_command(home, app_url, root, browse_port)}", flush=True)
        return outcome
    finally:
        dev.stop()
        llm_server.shutdown()
        store.close()


def record_verdict(outcome: Outcome, store: RecoveryStore, found: dict, dev: DagsterDev, *,
                   timeout: float = 120) -> None:
    """Each pipeline's status, read once its resume runs have ended: the polling above stops at a fixed
    deadline, and a resume still running then must be waited for before its pipeline is judged (it was judged
    first, and the demo reported "ended running" for a pipeline it printed as completed a moment later)."""
    for job, p in found.items():
        resumes = [r for r in dev.runs(tags={TAG_PIPELINE: str(p.id)}) if TAG_RESUME_NUMBER in r.tags]
        for run in resumes:
            dev.wait_run(run.run_id, statuses=TERMINAL, timeout=timeout)
        outcome.resumes[job] = len(resumes)
        outcome.runs[job] = len(dev.runs(job_name=job))
        outcome.final_status[job] = store.pipelines.get_pipeline(p.id).status


def summarize(t: Timeline, store: RecoveryStore, ontology_id: int, done_at_kill: int | None = None) -> None:
    after = items_done(store, ontology_id, "enrich_columns")
    with store.read_only() as conn:
        redone = conn.execute(text("SELECT count(*) FROM rx_node_items WHERE pipeline_id = :p"
                                   " AND node_name = 'enrich_columns' AND epoch > 1"), {"p": ontology_id}).scalar() or 0
        claims = conn.execute(text("SELECT count(*) FROM rx_transitions"
                                   " WHERE entity_type = 'queue_item' AND event = 'claimed'")).scalar() or 0
        docs = conn.execute(text("SELECT count(*) FROM rx_queue_items")).scalar() or 0
    kept = after - redone
    # The killed run worker's step process outlives it and keeps checkpointing under the old epoch
    # until the reclaim moves the epoch on: that is why more can be kept than were done at the kill.
    later = (f" ({done_at_kill} done at the kill; its orphaned step process finished {kept - done_at_kill} more "
             "before the reclaim fenced it out)" if done_at_kill is not None and kept > done_at_kill else "")
    t.say(f"ontology: enrich_columns {after}/10 tables: {kept} kept from the killed run{later}, "
          f"{redone} re-done by the resume; completed nodes were skipped, not called again")
    t.say(f"ocr: {docs} documents, {claims} claims in all ({claims - docs} re-done after the crash)")


def main() -> int:
    root = Path.cwd()
    keep_ui = sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("RECOVERY_DEMO_KEEP_UI", "1") != "0"
    var = Path(os.environ.get("RECOVERY_DEMO_CRASH_DIR", root / "var" / "demo-crash"))
    t = Timeline()
    # First, a run killed while its provider batch is pending: the resume re-attaches instead of paying again.
    problems = run_batch_demo(var, t.say)
    for problem in problems:
        t.say(f"CHECK FAILED: {problem}")
    if not problems:
        t.say("CHECK PASSED: the resume re-attached to the pending batch: 1 submission, 0 paid twice")
    if os.environ.get("RECOVERY_DEMO_ONLY") != "batch":
        problems += run_demo(root, var, t, keep_ui=keep_ui, port=port_from_env()).problems()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
