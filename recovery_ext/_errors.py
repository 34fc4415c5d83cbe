"""The exceptions of recovery-ext.

Every exception derives from :class:`RecoveryError`; its docstring is its default
message, so ``raise OwnershipLost()`` already says something useful.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """How to add an extra: recovery-ext installs from a clone or a path, not from a package index."""
    return f"pip install -e '.[{extra}]' in a clone of recovery-ext, or pip install '/path/to/recovery-ext[{extra}]'"


class RecoveryError(Exception):
    """A recovery-ext operation failed."""

    def __init__(self, message: str | None = None, **context: object) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.context = context
        super().__init__(self.message)


class ConfigurationError(RecoveryError, ValueError):
    """Invalid recovery-ext settings."""


# Shown in tracebacks and Dagster's load errors as ``recovery_ext.ConfigurationError``, where users import it.
ConfigurationError.__module__ = "recovery_ext"


class StoreError(RecoveryError):
    """The recovery store could not complete the operation."""


class StoreUnavailable(StoreError):
    """The recovery store's database cannot be reached."""

    retryable = True
    category = "database_transient"

    def __init__(self, message: str | None = None, *, session_lost: bool = False, **context: object) -> None:
        super().__init__(message, **context)
        # An established session the server or the network ended (not a connection that could not be made):
        # a call whose first attempt outlived the store's retry budget still gets one try on a new session.
        self.session_lost = session_lost


class MigrationError(StoreError):
    """Applying the schema migrations failed."""


class NotFound(StoreError, LookupError):
    """No such row in the recovery store."""


class IllegalTransition(StoreError):
    """That status change is not allowed; nothing was written."""

    retryable = False


class UnfinishedItems(IllegalTransition):
    """A node cannot complete while items it asked for (``ctx.items``) are unfinished; nothing was written."""


class OwnershipLost(StoreError):
    """This worker no longer owns the pipeline; its write was refused."""

    retryable = False

    def __init__(self, message: str | None = None, *, owner: str | None = None, **context: object) -> None:
        self.owner = owner
        if message is None and owner:
            message = f"ownership lost: superseded by run {owner}"
        super().__init__(message, owner=owner, **context)


class ItemTakenOver(OwnershipLost):
    """Another worker holds (or already finished) this queue item; this worker's write was refused."""


class UnresumableSelection(RecoveryError):
    """The carried op selection cannot be run as a subset of the whole job."""


class MissingRunLiveness(RecoveryError):
    """A recoverable op ran in a job whose executor does not keep the pipeline alive."""


class StopRequested(RecoveryError):
    """The work was asked to stop before it finished."""

    retryable = False


def in_chain(exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc``'s cause chain (``exc`` itself included), or in the members of
    an exception group in it, if any: a client library may wrap ours (an SDK's connection error around the
    journaling transport's ``OwnershipLost``), and an ``asyncio.TaskGroup`` raises its tasks' errors as one
    ``ExceptionGroup`` (a stop refused to one task of a body's group is still a stop)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 64:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kinds):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        following = current.__cause__ or current.__context__
        if following is not None:
            todo.append(following)
    return None
