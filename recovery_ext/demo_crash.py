"""``make demo-crash``: kill -9 the run workers of both jobs mid-way and watch them recover.

It starts `dagster dev` on 127.0.0.1 with a throw-away DAGSTER_HOME and SQLite tables under
var/demo-crash, short heartbeats (1 s / 3 s) and a 1 s sensor, launches the ontology and OCR
jobs, kills each run worker while it works, and prints the timeline as recovery happens.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from dagster import DagsterRunStatus

from .devserver import DagsterDev, wait_for
from .integration.recoverable import TAG_PIPELINE
from .schema import node_items, queue_items, transitions
from .store import RecoveryStore


TERMINAL = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[+{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)


def items_done(store: RecoveryStore, pipeline_id: int, node: str) -> int:
    with store.read() as conn:
        return conn.scalar(select(func.count()).where(node_items.c.pipeline_id == pipeline_id,
                                                      node_items.c.node_name == node)) or 0


def main() -> int:
    root = Path.cwd()
    var = root / "var" / "demo-crash"
    shutil.rmtree(var, ignore_errors=True)
    home = var / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(root / "deploy" / "dagster.sqlite.yaml", home / "dagster.yaml")
    from .demo_llm import serve

    llm_server, llm_url = serve(latency=0.7)
    app_url = f"sqlite:///{var / 'recovery.sqlite3'}"
    env = {"RECOVERY_DATABASE_URL": app_url, "RECOVERY_DEMO_DIR": str(var / "inputs"),
           "RECOVERY_HEARTBEAT_INTERVAL": "1", "RECOVERY_ORPHAN_HEARTBEAT_THRESHOLD": "3",
           "RECOVERY_SENSOR_INTERVAL": "1", "RECOVERY_LLM_BASE_URL": llm_url, "RECOVERY_LLM_MODEL": "demo-llm"}
    os.environ.update(env)
    from .pipelines.sample_data import prepare_demo

    prepare_demo(var / "inputs")
    t = Timeline()
    t.say("starting dagster dev on 127.0.0.1 (webserver, daemon, code server) ...")
    dev = DagsterDev(root / "workspace.yaml", home, env, workspace=True).start()
    store = RecoveryStore(app_url)
    try:
        store.migrate()
        t.say(f"Dagster UI: http://127.0.0.1:{dev.port}  (application tables: {app_url})")
        ontology_run = dev.launch("ontology_extraction", {})
        ocr_run = dev.launch("ocr_documents", {})
        t.say(f"launched ontology_extraction run {ontology_run[:8]} and ocr_documents run {ocr_run[:8]}")

        ontology = wait_for(lambda: store.find_pipeline(ontology_run), timeout=120, what="the ontology pipeline")
        ocr = wait_for(lambda: store.find_pipeline(ocr_run), timeout=120, what="the OCR pipeline")
        before, done_before = None, None
        deadline = time.monotonic() + 240
        while (before is None or done_before is None) and time.monotonic() < deadline:
            if before is None and items_done(store, ontology.id, "enrich_columns") >= 3:
                before = items_done(store, ontology.id, "enrich_columns")
                pid = dev.run_worker_pid(ontology_run)
                os.kill(pid, signal.SIGKILL)
                t.say(f"kill -9 run worker pid {pid} of ontology_extraction: enrich_columns had {before}/10 "
                      "tables done")
            items = store.list_items("ocr")
            if done_before is None and any(i.status == "completed" for i in items):
                done_before = sum(i.status == "completed" for i in items)
                pid = dev.run_worker_pid(ocr_run)
                os.kill(pid, signal.SIGKILL)
                t.say(f"kill -9 run worker pid {pid} of ocr_documents: {done_before}/{len(items)} documents done")
            time.sleep(0.1)

        seen_events: set[int] = set()
        seen_runs: dict[str, str] = {}
        pending = {ontology.id: "ontology_extraction", ocr.id: "ocr_documents"}
        deadline = time.monotonic() + 240
        while pending and time.monotonic() < deadline:
            for e in store.recent_events(kinds=("pipeline_recovered", "pipeline_stuck", "item_reset", "item_dead"),
                                         after_id=max(seen_events, default=0)):
                seen_events.add(e["id"])
                p = e["payload"] or {}
                if e["kind"] == "pipeline_recovered":
                    t.say(f"orphan detected ({p.get('cause')}) -> reclaimed pipeline {e['pipeline_id']} "
                          f"({p.get('job')}) as resume #{p.get('resume_number')}; "
                          f"reset nodes: {', '.join(p.get('reset_nodes') or []) or '-'}")
                else:
                    t.say(f"{e['kind']}: {p}")
            for pipeline_id in list(pending):
                for run in dev.runs(tags={TAG_PIPELINE: str(pipeline_id)}):
                    if seen_runs.get(run.run_id) != run.status.value:
                        seen_runs[run.run_id] = run.status.value
                        t.say(f"resume run {run.run_id[:8]} of pipeline {pipeline_id}: {run.status.value}")
                if store.get_pipeline(pipeline_id).status in ("completed", "failed"):
                    p = store.get_pipeline(pipeline_id)
                    t.say(f"pipeline {pipeline_id} ({pending.pop(pipeline_id)}) {p.status}")
            time.sleep(0.3)
        after = items_done(store, ontology.id, "enrich_columns")
        with store.read() as conn:
            redone = conn.scalar(select(func.count()).where(node_items.c.pipeline_id == ontology.id,
                                                            node_items.c.node_name == "enrich_columns",
                                                            node_items.c.epoch > 1)) or 0
            claims = conn.scalar(select(func.count()).where(transitions.c.entity_type == "queue_item",
                                                            transitions.c.event == "claimed")) or 0
            docs = conn.scalar(select(func.count()).select_from(queue_items)) or 0
        for pipeline_id in (ontology.id, ocr.id):
            for run in dev.runs(tags={TAG_PIPELINE: str(pipeline_id)}):
                final = dev.wait_run(run.run_id, statuses=TERMINAL, timeout=60)
                t.say(f"resume run {run.run_id[:8]} of pipeline {pipeline_id}: {final.status.value}")
        t.say(f"ontology: enrich_columns {after}/10 tables: {after - redone} kept from the killed run, "
              f"{redone} re-done by the resume; completed nodes were skipped, not called again")
        t.say(f"ocr: {docs} documents, {claims} claims in all ({claims - docs} re-done after the crash)")
        print(f"\nInspect: recovery-ext --database-url {app_url} status | pipelines show {ontology.id}")
        return 0 if not pending else 1
    finally:
        dev.stop()
        llm_server.shutdown()
        store.close()


if __name__ == "__main__":
    sys.exit(main())
