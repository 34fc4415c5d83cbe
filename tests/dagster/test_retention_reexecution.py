"""A UI re-execution of a failed run whose pipeline retention pruned: new work under a new pipeline, not an error."""

from __future__ import annotations

from pathlib import Path

from dagster import ReexecutionOptions, build_reconstructable_job, execute_job
from sqlalchemy import update

from recovery_ext._dagster.tags import TAG_PIPELINE
from recovery_ext._store.schema import pipelines
from recovery_ext._store.store import Pipelines, RecoveryStore

HERE = Path(__file__).resolve().parents[1] / "support"


def failing_first_job():
    """The in-process job whose node ``c`` fails its first run and succeeds when re-executed, with that config."""
    job = build_reconstructable_job("replay_defs", "bound", reconstructable_args=("mixed_inproc",),
                                    reconstructor_working_directory=str(HERE))
    return job, {"ops": {"c": {"config": {"fail_first_run": True}}}}


def test_a_reexecution_of_a_run_whose_pipeline_was_pruned_starts_a_new_pipeline(instance, monkeypatch, sqlite_url):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", sqlite_url)
    store = RecoveryStore(sqlite_url)
    store.migrate()
    job, run_config = failing_first_job()
    with execute_job(job, instance=instance, run_config=run_config, raise_on_error=False) as first:
        assert not first.success
    (failed,) = store.reports.list_pipelines()
    assert failed.status == "failed" and instance.get_run_by_id(first.run_id).tags[TAG_PIPELINE] == str(failed.id)
    with store.write() as conn:
        conn.execute(update(pipelines).values(completed_at=store.dialect.now_plus(-100 * 86400.0)))
    newer = store.pipelines.create_pipeline("other", ["x"], owner="newer", origin_run_id="newer")  # the newest is kept
    assert store.reports.prune_finished_pipelines(86400.0).pipelines == 1

    with execute_job(job, instance=instance, run_config=run_config,
                     reexecution_options=ReexecutionOptions(parent_run_id=first.run_id)) as second:
        assert second.success
    (fresh,) = [p for p in store.reports.list_pipelines() if p.id != newer.pipeline_id]
    assert (fresh.id > newer.pipeline_id, fresh.status, fresh.owner) == (True, "completed", second.run_id)


def test_a_prune_between_the_reexecutions_read_and_its_take_over_starts_a_new_pipeline(instance, monkeypatch,
                                                                                        sqlite_url):
    """The race: the re-execution reads the failed pipeline, a prune deletes it, then the take-over finds nothing.
    The prune runs inside the take-over call here, just before it, on the same database."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", sqlite_url)
    import replay_defs  # its resource took a URL when first imported (None: it reads the environment at run time)

    store = RecoveryStore(replay_defs.defs.resources["recovery"].database_url or sqlite_url)
    store.migrate()
    job, run_config = failing_first_job()
    with execute_job(job, instance=instance, run_config=run_config, raise_on_error=False) as first:
        assert not first.success
    failed = store.pipelines.find_pipeline(first.run_id)
    assert failed is not None and failed.status == "failed"
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == failed.id)
                     .values(completed_at=store.dialect.now_plus(-100 * 86400.0)))
    store.pipelines.create_pipeline("other", ["x"], owner="newest", origin_run_id="newest")  # the newest is kept
    take_over, pruned = Pipelines.take_over, []

    def pruned_first(self, pipeline_id, *args, **kwargs):
        pruned.append(store.reports.prune_finished_pipelines(86400.0).pipelines)
        return take_over(self, pipeline_id, *args, **kwargs)

    monkeypatch.setattr(Pipelines, "take_over", pruned_first)
    with execute_job(job, instance=instance, run_config=run_config,
                     reexecution_options=ReexecutionOptions(parent_run_id=first.run_id)) as second:
        assert second.success
    assert pruned == [1]
    (fresh,) = [p for p in store.reports.list_pipelines() if p.owner == second.run_id]
    assert fresh.id != failed.id and fresh.status == "completed"
