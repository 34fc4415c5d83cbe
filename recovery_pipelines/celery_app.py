"""The Celery app workers run for the shipped jobs on ``RECOVERY_EXECUTOR=celery``:

    celery -A recovery_pipelines.celery_app worker -Q dagster -c 1

dagster-celery's tasks (steps, and the ``CeleryRunLauncher``'s run workers) on the broker and
result backend of ``RECOVERY_CELERY_BROKER`` / ``RECOVERY_CELERY_BACKEND``, with the settings the
executor uses (see ``deploy/celery/README.md``).
"""

from recovery_ext import make_celery_app

app = make_celery_app()
