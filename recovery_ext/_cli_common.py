"""What every `recovery-ext` command shares: argument types, the output (human or JSON), and opening the store
with one clear error per failure (the commands live in _cli.py and the modules it adds)."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, overload

import click

from recovery_ext._conventions import jsonable
from recovery_ext._errors import ConfigurationError, NotFound, RecoveryError, StoreUnavailable
from recovery_ext._settings import LONGEST, check_deployment, parse_duration
from recovery_ext._classify.redaction import redact
from recovery_ext._store.database import retry_log
from recovery_ext._store.dialects import Dialect
from recovery_ext._store.store import RecoveryStore, default_database_url

CLI_RETRY_BUDGET = 3.0


class IntRange(click.IntRange):
    """click's IntRange for digits an operator types: int() also reads other scripts' digits ("９０" is 90)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{value!r} is not a valid integer", param, ctx)
        return super().convert(value, param, ctx)


# Row ids are BIGINT: a larger number is a usage error (exit 2), never a driver overflow.
ROW_ID = IntRange(min=1, max=2**63 - 1)
# More distinct --kind values than any query should bind (PostgreSQL takes at most 65535 parameters).
MAX_KINDS = 1000


class BadArgument(click.ClickException):
    """A bad argument found after parsing (a database URL, a missing SQLite file): one line, exit 2."""

    exit_code = 2


if TYPE_CHECKING:  # click's ParamType is generic from click 8.5 on; the oldest click we take (8.1) is not
    _FloatParam = click.ParamType[float, Any]
else:
    _FloatParam = click.ParamType


class Duration(_FloatParam):
    """``90``, ``90s``, ``10m``, ``1h``, ``1d``: finite and within bounds (else exit 2)."""

    name = "duration"
    minimum, maximum = 1.0, 366 * 86400.0

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not self.minimum <= seconds <= self.maximum:
            self.fail(f"must be between {self.minimum:g} and {self.maximum:g} seconds, got {value!r}", param, ctx)
        return seconds


class PollInterval(Duration):
    name = "seconds"
    minimum, maximum = 0.1, 60.0


class Age(Duration):
    """How long ago a pipeline finished: ``12h``, ``90d``, at least an hour (a pipeline that just failed may
    still be taken over by Dagster's run retry, and late ledger writes may still arrive), at most a century."""

    name = "duration"
    minimum, maximum = 3600.0, LONGEST


if TYPE_CHECKING:
    _TextParam = click.ParamType[str, Any]
else:
    _TextParam = click.ParamType


class DeploymentName(_TextParam):
    """A deployment's name as a filter, checked as a deployment is named (else exit 2): a name no deployment can
    have (empty, a NUL, a space) matched nothing, and the command said so by showing nothing."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_deployment("--deployment", value)
        except ConfigurationError as exc:
            self.fail(str(exc), param, ctx)


class Amount(_FloatParam):
    """A finite amount from 0 to ``maximum`` (else exit 2): click's FloatRange lets NaN through, since every
    comparison with NaN is false."""

    name = "amount"

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            if isinstance(value, str) and not value.isascii():  # float() reads other scripts' digits too
                raise ValueError(value)
            amount = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(amount) or not 0 <= amount <= self.maximum:
            self.fail(f"must be an amount from 0 to {self.maximum:g}, got {value!r}", param, ctx)
        return amount


def _when(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


class Output:
    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def emit(self, data: Any, human: Callable[[], None]) -> None:
        if self.json:
            click.echo(json.dumps(jsonable(data), indent=2, sort_keys=True))
        else:
            human()

    def progress(self, message: str) -> None:
        if not self.json:
            click.echo(message, err=True)

    def note_unknown_deployment(self, store: Any, deployment: str | None) -> None:
        """A ``--deployment`` no pipeline has: said on stderr (even with ``--json``), so a mistyped name does not
        read as "nothing there" (an empty status, a prune of 0). Not an error: a deployment whose pipelines
        were all pruned has none either."""
        if deployment is not None and not store.reports.list_pipelines(deployment=deployment, limit=1):
            click.echo(f"note: no pipeline of deployment {deployment!r} is known "
                       "(see `recovery-ext pipelines list`)", err=True)


def open_store(obj: dict[str, Any], *, creates_database: bool = False) -> RecoveryStore:
    """The store of ``--database-url`` (or the default), opened only once the arguments were accepted.

    Only a command that creates the database (``migrate``) may create a SQLite file or its folder:
    anywhere else a missing file is a mistyped path, and opening it would leave an empty database.
    """
    url = obj["url"] or default_database_url(create=creates_database)
    try:
        dialect = Dialect.for_url(url)
        if not creates_database:
            _require_sqlite_file(dialect)
        # An operator waits a few seconds at most for an unreachable database, not a heartbeat timeout.
        return RecoveryStore(url, retry_budget=CLI_RETRY_BUDGET, connect_timeout=5)
    except ConfigurationError as exc:
        raise BadArgument(redact(str(exc))) from None


@contextlib.contextmanager
def _quiet_store_retries() -> Iterator[None]:
    """The store still retries a transient error within CLI_RETRY_BUDGET, but an operator sees one line, the
    outcome, not a warning per attempt."""
    previous = retry_log.level
    retry_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        retry_log.setLevel(previous)


def _require_sqlite_file(dialect: Dialect) -> None:
    missing = dialect.missing_database_file()
    if missing is not None:
        raise ConfigurationError(f"no SQLite database at {missing} (check --database-url, or create it with "
                                 "`recovery-ext migrate`)")


# A command's body: ``fn(store, out, **its options)``.
CommandBody = Callable[..., Any]


@overload
def command(fn: CommandBody, *, creates_database: bool = ..., checks_schema: bool = ...,
            serves: bool = ...) -> Callable[..., Any]: ...
@overload
def command(fn: None = ..., *, creates_database: bool = ..., checks_schema: bool = ...,
            serves: bool = ...) -> Callable[[CommandBody], Callable[..., Any]]: ...
def command(fn: CommandBody | None = None, *, creates_database: bool = False,
            checks_schema: bool = True, serves: bool = False) -> Callable[..., Any]:
    """Open the store, map our errors to a clear message and exit status 1 (a bad argument: 2).

    ``checks_schema=False``: the command checks the schema itself, when it can (the exporter starts while the
    database is down). A command that runs until stopped (``serves``, or given ``--follow``) keeps the store's
    warning for each retried attempt, the trace of a flapping database; any other prints its outcome alone."""
    if fn is None:
        return functools.partial(command, creates_database=creates_database, checks_schema=checks_schema,
                                 serves=serves)

    def wrapper(obj: dict[str, Any], /, as_json: bool, database_url: str | None, **kwargs: Any) -> Any:
        if database_url is not None:  # given after the command: it stands for this command alone
            obj = {**obj, "url": database_url}
        if serves or kwargs.get("follow"):
            return run(obj, as_json, **kwargs)
        with _quiet_store_retries():
            return run(obj, as_json, **kwargs)

    def run(obj: dict[str, Any], as_json: bool, **kwargs: Any) -> Any:
        out = Output(as_json or obj["json"])
        store = open_store(obj, creates_database=creates_database)
        try:
            if checks_schema:
                store.check_schema()  # a newer release's tables: one clear line, not a raw SQL error later
            return fn(store, out, **kwargs)
        except BrokenPipeError:
            raise
        except StoreUnavailable as exc:
            raise click.ClickException(f"cannot reach the database at {store.dialect.safe_url()}: {exc}") from None
        except NotFound as exc:
            raise click.ClickException(str(exc)) from None
        except RecoveryError as exc:
            hint = ""
            try:
                if store.pending_migrations():
                    hint = " (the schema is not up to date: run `recovery-ext migrate`)"
            except RecoveryError:
                pass
            raise click.ClickException(redact(str(exc)) + hint) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, KeyboardInterrupt):
            raise
        except OSError as exc:  # e.g. demo setup --folder /proc/x
            raise click.ClickException(redact(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))) from None
        except Exception as exc:  # noqa: BLE001 - no traceback reaches a user, whatever the input
            raise click.ClickException(f"unexpected error ({type(exc).__name__}): {redact(exc)}") from None
        finally:
            store.close()

    functools.update_wrapper(wrapper, fn)  # the command keeps the body's name and help
    json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
    # as the group's own option, so either place works: `recovery-ext status --database-url URL` too
    url_option = click.option("--database-url", "database_url", metavar="URL", default=None,
                              help="Application tables (postgresql://... or sqlite:///...), as before the command.")
    return url_option(json_option(click.pass_obj(wrapper)))
