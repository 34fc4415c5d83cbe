"""``recovery-ext demo ...``: the demo's commands, added to the operator CLI through an entry point."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import click

from recovery_ext import RecoveryError, redact, redact_url

from .ontology_schema import MIGRATIONS


class Folder(click.Path):
    """A folder argument; click's own check stats the path, which raises on a NUL byte instead of failing."""

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        if "\x00" in str(value):
            self.fail("a path cannot contain a NUL byte", param, ctx)
        return super().convert(value, param, ctx)


# What the demo's inputs and jobs import (the `pipelines` extra): checked before anything is written.
PIPELINES_EXTRA = ("PIL", "pypdfium2", "numpy", "openai", "rapidocr_onnxruntime")


def require_pipelines_extra() -> None:
    """One line naming the extra when a module of it is missing, before the command writes anything."""
    missing = []
    for name in PIPELINES_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that fails to import, or a module set to None
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise click.ClickException(f"the demo needs the pipelines extra (missing: {', '.join(missing)}): "
                                   "pip install -e '.[pipelines]' from the project's root")


@click.group()
def demo() -> None:
    """The demo pipelines: sample inputs, new documents for the OCR queue, a crash on demand."""


@demo.command("setup")
@click.option("--folder", type=Folder(), help="Where to put the sample inputs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def setup(ctx: click.Context, folder: str | None, as_json: bool) -> None:
    """Create the sample shop database and scanned PDFs, and migrate the application tables."""
    require_pipelines_extra()
    from .sample_data import prepare_demo

    root = ctx.find_root().obj
    store = root["open_store"](creates_database=True)  # a bad URL: one clear line, exit 2
    try:
        made = prepare_demo(Path(folder) if folder else None)
        applied = store.migrate(MIGRATIONS)
    except RecoveryError as exc:
        raise click.ClickException(redact(str(exc))) from None
    except OSError as exc:  # e.g. --folder /proc/x
        raise click.ClickException(redact(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))) from None
    finally:
        store.close()
    result = {**made, "migrations_applied": len(applied)}
    if as_json or root.get("json"):
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        click.echo(f"sample database: {made['sample_database']}\nscanned PDFs: {made['scans']}\n"
                   f"application tables: {redact_url(store.url)}")


def _echo(result: dict, as_json: bool, human: str) -> None:
    click.echo(json.dumps(result, indent=2, sort_keys=True) if as_json else human)


@demo.command("add-documents")
@click.argument("count", type=click.IntRange(1, 200))
@click.option("--folder", type=Folder(),
              help="The OCR job's folder (default: $RECOVERY_OCR_FOLDER, else the demo's scans).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def add_documents(ctx: click.Context, count: int, folder: str | None, as_json: bool) -> None:
    """Put COUNT new scanned PDFs in the OCR folder: the next ocr_documents run has work to do."""
    require_pipelines_extra()
    from .sample_data import add_scanned_documents, scans_dir

    target = Path(folder or os.environ.get("RECOVERY_OCR_FOLDER") or scans_dir())
    try:
        names = add_scanned_documents(target, count)
    except OSError as exc:
        raise click.ClickException(redact(f"{exc.strerror or exc}: {exc.filename or target}")) from None
    _echo({"folder": str(target), "added": names}, as_json or ctx.find_root().obj.get("json"),
          f"added {len(names)} scans to {target}: {', '.join(names)}\n"
          "launch ocr_documents from the Launchpad to OCR them")


def _dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home")
    if not home.is_dir():
        raise click.ClickException(f"no Dagster instance at {home}: set DAGSTER_HOME to the one `make dev` "
                                   "uses (.dagster_home in the project)")
    return home


@demo.command("kill")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def kill(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """kill -9 the run worker of RUN_ID (the run must be running): a crash to watch recovery from.

    The pid is the one the run logged as "Started process for run (pid: N)", checked to still be
    that run worker. Uses the Dagster instance in $DAGSTER_HOME (default ./.dagster_home).
    """
    from dagster import DagsterInstance

    from .run_worker import RunWorkerNotFound, find_run_worker

    home = _dagster_home()
    run_id = run_id.strip()
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            worker = find_run_worker(instance, run_id)
            os.kill(worker.pid, signal.SIGKILL)
    except RunWorkerNotFound as exc:
        raise click.ClickException(str(exc)) from None
    except ProcessLookupError:
        raise click.ClickException(f"the run worker of run {run_id} exited before it could be killed") from None
    except PermissionError:
        raise click.ClickException(f"not allowed to kill the run worker of run {run_id}") from None
    except Exception as exc:  # noqa: BLE001 - a broken instance gives one line, never a traceback
        raise click.ClickException(f"cannot read the Dagster instance at {home} ({type(exc).__name__}): "
                                   f"{redact(exc)}") from None
    _echo({"run_id": run_id, "pid": worker.pid, "signal": "SIGKILL"}, as_json or ctx.find_root().obj.get("json"),
          f"kill -9 run worker pid {worker.pid} of run {run_id}\n"
          "In the UI: the run turns FAILURE; the orphan sensor (recovery_orphan_sensor) reclaims its pipeline and "
          "launches one resume run, tagged recovery/resumed_from, that redoes only the unfinished items.")
