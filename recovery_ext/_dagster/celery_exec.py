"""Dagster's Celery executor (``dagster-celery``) under recovery-ext.

Install with the ``celery`` extra. ``with_recovery(celery_executor)`` keeps dagster-celery's name
(``celery``) and config schema; :func:`recoverable_celery_executor` is the same with its defaults
read from ``RECOVERY_CELERY_BROKER`` / ``RECOVERY_CELERY_BACKEND`` and :func:`celery_settings`,
and :func:`make_celery_app` builds the app workers run from the same variables and settings, so
a worker and the run worker that sends it steps always agree.

What the settings add to dagster-celery's defaults, for a deployment that must survive crashes:

- the result backend must outlive a worker (Redis, not ``rpc://``): a step's result is read by
  the run worker, possibly long after the worker that stored it died; every backend call is
  retried through a broker or backend restart (``result_backend_always_retry``) instead of
  failing the run;
- publishing a step is retried for about a minute (dagster-celery gives up after 3 tries in
  about a second, which turns a broker restart into a failed run);
- tasks are acknowledged when received (``task_acks_late`` off): a task whose worker died is
  never redelivered into the superseded run; recovery-ext resumes the pipeline instead;
- a worker takes a step only when it has a free process (``worker_disable_prefetch``, Redis
  broker), so a step waits in the broker, where any idle worker can take it, not reserved behind
  a busy one (with early acks, prefetch 1 still reserves one more task per busy worker).

A run whose pipeline was reclaimed stops instead of waiting for ever on a dead worker: see
:mod:`recovery_ext._dagster.celery_fence`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from recovery_ext._classify.redaction import redact_url
from recovery_ext._errors import ConfigurationError

BROKER_ENV = "RECOVERY_CELERY_BROKER"
BACKEND_ENV = "RECOVERY_CELERY_BACKEND"
if TYPE_CHECKING:
    from dagster import ExecutorDefinition

STEP_QUEUE = "dagster"     # dagster-celery's queue for steps (its make_app declares it)


def celery_settings() -> dict[str, Any]:
    """The Celery settings both the run worker's app and the workers' app use (``config_source``)."""
    return {
        "worker_prefetch_multiplier": 1,
        # a worker takes a task only when it has a free process (Redis broker): with early acks a busy
        # worker would otherwise reserve one more step and hold it while another worker sits idle
        "worker_disable_prefetch": True,
        "task_acks_late": False,
        "result_backend_always_retry": True,
        "result_backend_max_retries": 1_000_000,
        "result_backend_base_sleep_between_retries_ms": 100,
        "result_backend_max_sleep_between_retries_ms": 2_000,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # publishing a step: retried for about a minute (dagster-celery: 3 tries in about a second)
        "broker_transport_options": {"max_retries": 60, "interval_start": 0, "interval_step": 0.5,
                                     "interval_max": 1.0},
        "redis_socket_connect_timeout": 5,
        "redis_socket_timeout": 30,
        "redis_retry_on_timeout": True,
    }


def celery_executor_config(broker: str | None = None, backend: str | None = None) -> dict[str, Any]:
    """Executor config for ``celery_executor``: the URLs from the arguments or the environment."""
    broker = broker or os.environ.get(BROKER_ENV)
    backend = backend or os.environ.get(BACKEND_ENV)
    if not broker:
        raise ValueError(f"the Celery executor needs a broker: set {BROKER_ENV} (e.g. redis://127.0.0.1:6379/0)")
    if not backend:
        raise ValueError(f"the Celery executor needs a result backend that survives a worker: set {BACKEND_ENV} "
                         "(e.g. redis://127.0.0.1:6379/1)")
    if backend.startswith("rpc://"):
        raise ValueError(f"{BACKEND_ENV}={backend!r}: rpc:// loses the result of a step whose run worker or "
                         "worker restarts; use a stored backend such as redis://")
    return {"broker": broker, "backend": backend, "config_source": celery_settings()}


def recoverable_celery_executor(config: Mapping[str, Any] | None = None) -> ExecutorDefinition:
    """``with_recovery(celery_executor)`` named ``celery``, its defaults from the environment.

    The config schema is dagster-celery's; only the defaults of ``broker``, ``backend`` and
    ``config_source`` change, so a run's ``execution: config:`` still overrides each of them.
    The URLs are defaults of the form ``{"env": "RECOVERY_CELERY_BROKER"}``, read by the run worker
    when the run starts, as the database URL and the LLM key are: a default value is stored in every
    run's job snapshot and shown in the Launchpad, and a broker URL carries a password. ``config``
    may name other variables the same way; a URL given as text must not hold a password.
    """
    from dagster import Field, Noneable, Permissive, Shape, StringSource
    from dagster_celery import celery_executor

    from recovery_ext._dagster.executor import with_recovery

    wrapped = with_recovery(celery_executor)
    if config is None:
        celery_executor_config()  # refused now, with the variable named, when unset or rpc://
        values: dict[str, Any] = {"broker": {"env": BROKER_ENV}, "backend": {"env": BACKEND_ENV},
                                  "config_source": celery_settings()}
    else:
        values = dict(config)
        for key in ("broker", "backend"):
            _no_literal_password(key, values.get(key))
    shape = wrapped.config_schema.as_field().config_type
    assert isinstance(shape, Shape)  # dagster-celery's executor config: named fields
    fields = shape.fields
    schema = {
        "broker": Field(Noneable(StringSource), is_required=False, default_value=values["broker"],
                        description=fields["broker"].description),
        "backend": Field(Noneable(StringSource), is_required=False, default_value=values["backend"],
                         description=fields["backend"].description),
        "include": fields["include"],
        "config_source": Field(Noneable(Permissive()),  # type: ignore[no-untyped-call]  # untyped in Dagster
                               is_required=False,
                               default_value=dict(values.get("config_source") or {}),
                               description=fields["config_source"].description),
        "retries": fields["retries"],
    }
    return wrapped.configured(lambda cfg: {k: v for k, v in cfg.items() if v is not None}, name="celery",
                              config_schema=schema)


def _no_literal_password(key: str, value: Any) -> None:
    if isinstance(value, str) and redact_url(value) != value:
        raise ConfigurationError(f"the Celery {key} URL holds a secret, which a default would store in every run's "
                                 f"job snapshot: pass it as {{'env': 'VARIABLE'}} instead ({redact_url(value)})")


def make_celery_app(broker: str | None = None, backend: str | None = None) -> Any:  # a celery.Celery
    """The app Celery workers run (dagster-celery's tasks), from the same URLs and settings as the executor."""
    from recovery_ext._dagster.compat import dagster_celery_internals

    celery = dagster_celery_internals()
    config = celery_executor_config(broker, backend)
    app = celery.make_app({"broker": config["broker"], "backend": config["backend"], "include": [],
                           "config_source": celery.dict_wrapper(dict(celery.default_config,
                                                                     **config["config_source"]))})
    celery.create_task(app)
    celery.create_execute_job_task(app)
    celery.create_resume_job_task(app)
    watch_pool_processes()
    return app


HOST_WATCH_INTERVAL_ENV = "RECOVERY_HOST_WATCH_INTERVAL"
_host_watch: list[Any] = []


def watch_pool_processes() -> None:
    """A worker's main process knows its pool processes: it names itself their watcher before the pool
    starts (they inherit it and record it on the nodes they run), then checks them every
    ``$RECOVERY_HOST_WATCH_INTERVAL`` seconds (default 2): a live one's node is vouched for, a dead
    one's is reported dead, so the orphan sensor reclaims it at its next tick. Its store is the one
    ``$RECOVERY_DATABASE_URL`` names (as the steps' resource defaults to)."""
    from celery import signals

    from recovery_ext._liveness.heartbeat import HostWatch
    from recovery_ext._settings import env_seconds
    from recovery_ext._store.store import RecoveryStore, default_database_url

    def named(**_: Any) -> None:  # the main process, before its pool starts
        if not _host_watch:
            _host_watch.append(HostWatch(lambda: RecoveryStore(default_database_url()),
                                         interval=env_seconds(HOST_WATCH_INTERVAL_ENV, 2.0), timeout=90.0))

    def ready(**_: Any) -> None:
        if _host_watch:
            _host_watch[0].start()

    def stopping(**_: Any) -> None:
        if _host_watch:
            _host_watch[0].stop()

    signals.worker_init.connect(named, weak=False)
    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutdown.connect(stopping, weak=False)
