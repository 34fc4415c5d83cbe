"""The shipped jobs on Dagster's Celery executor, deployed on one machine as deploy/celery/README.md says.

`dagster dev -w workspace.yaml` with RECOVERY_EXECUTOR=celery and deploy/celery/dagster.yaml
(PostgreSQL storage, the default run launcher), a private Redis as broker and result backend,
and one Celery worker started with `celery -A recovery_pipelines.celery_app worker`. Both shipped
jobs run to the end with every step executed by the Celery worker, under a CPU hog.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from celery_cluster import Redis
from databases import pg_database
from dagster import DagsterEventType, DagsterRunStatus

from recovery_ext import RecoveryStore
from recovery_pipelines.devserver import DagsterDev, wait_for
from recovery_pipelines.sample_data import prepare_demo, scans_dir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def deployment(pg_admin, tmp_path_factory, cpu_hog_module):
    tmp = tmp_path_factory.mktemp("celery_one_machine")
    demo = tmp / "demo"
    prepare_demo(demo)
    folder = tmp / "scans"                       # two of the sample scans keep the OCR short
    folder.mkdir()
    for pdf in sorted(scans_dir(demo).glob("*.pdf"))[:2]:
        shutil.copy(pdf, folder / pdf.name)
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "celery" / "dagster.yaml", home / "dagster.yaml")
    redis = Redis()
    redis.start()
    worker = None
    dev = None
    with pg_database(pg_admin) as dagster_db, pg_database(pg_admin) as app_db:
        env = {"DAGSTER_HOME": str(home), "DAGSTER_PG_URL": dagster_db.replace("postgresql://", "postgresql+psycopg2://"),
               "RECOVERY_DATABASE_URL": app_db, "RECOVERY_EXECUTOR": "celery",
               "RECOVERY_CELERY_BROKER": redis.url_at("127.0.0.1", 0),
               "RECOVERY_CELERY_BACKEND": redis.url_at("127.0.0.1", 1),
               "RECOVERY_DEMO_DIR": str(demo), "RECOVERY_OCR_FOLDER": str(folder),
               "RECOVERY_HEARTBEAT_INTERVAL": "1", "RECOVERY_ORPHAN_HEARTBEAT_THRESHOLD": "10",
               "RECOVERY_SENSOR_INTERVAL": "5"}
        saved = os.environ.get("DAGSTER_PG_URL")
        os.environ["DAGSTER_PG_URL"] = env["DAGSTER_PG_URL"]   # this process reads Dagster's storage too
        try:
            log = open(tmp / "worker.log", "wb")  # noqa: SIM115 - the worker writes to it until it stops
            worker = subprocess.Popen(
                [str(BIN / "celery"), "-A", "recovery_pipelines.celery_app", "worker", "-Q", "dagster", "-c", "2",
                 "-n", "steps@%h", "--without-gossip", "--without-mingle", "-l", "INFO"],
                cwd=str(ROOT), env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            dev = DagsterDev(ROOT / "workspace.yaml", home, env, workspace=True)
            dev.start(timeout=300)
            yield dev, RecoveryStore(app_db)
        finally:
            if dev is not None:
                dev.stop()
            if worker is not None:
                os.killpg(worker.pid, 9)
                worker.wait(30)
            redis.destroy()
            if saved is None:
                os.environ.pop("DAGSTER_PG_URL", None)
            else:
                os.environ["DAGSTER_PG_URL"] = saved


def test_both_shipped_jobs_run_every_step_on_celery_workers(deployment):
    dev, store = deployment
    runs = {job: dev.launch(job, {}) for job in ("ontology_extraction", "ocr_documents")}
    for job, run_id in runs.items():
        run = dev.wait_run(run_id, statuses=(DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE), timeout=420)
        assert run.status == DagsterRunStatus.SUCCESS, (
            f"{job}: {[e.message for e in dev.instance.all_logs(run_id)][-5:]}"
        )
        pipeline = wait_for(
            lambda r=run_id: store.pipelines.find_pipeline(r), timeout=30, what=f"the pipeline of {job}"
        )
        assert store.pipelines.get_pipeline(pipeline.id).status == "completed"
        started = {e.step_key for e in dev.instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)}
        on_celery = {e.step_key for e in dev.instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
                     if "in celery worker" in (e.message or "")}
        assert started and started <= on_celery, (job, started - on_celery)
    store.close()
