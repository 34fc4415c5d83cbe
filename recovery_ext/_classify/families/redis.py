"""redis-py: connection loss, a server loading or busy, failover and cluster reshuffles, pool
exhaustion and a ``WATCH`` conflict are transient; auth, permissions and command errors are not."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient

# MISCONF: the server cannot persist to disk (refuses writes until it can); NOREPLICAS: too few replicas
# acknowledged; UNBLOCKED: a blocking command was released by a failover
_TRANSIENT_REPLY_CODES = ("BUSY ", "LOADING ", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY ", "OOM ",
                          "MISCONF ", "NOREPLICAS ", "UNBLOCKED ")


def family() -> Family:
    types = partial(loaded_types, "redis.exceptions")
    typed = by_type([
        (types("AuthenticationError", "AuthorizationError", "NoPermissionError",
               "AuthenticationWrongNumberOfArgsError"),
         permanent("auth", "redis: not authenticated or not permitted")),
        (types("BusyLoadingError", "TryAgainError", "ClusterDownError", "ReadOnlyError", "OutOfMemoryError",
               "MaxConnectionsError", "AskError"),
         transient("resource_exhausted", "redis: the server is loading, busy, failing over or full")),
        (types("WatchError"), transient("database_transient", "redis: a watched key changed (optimistic lock)")),
        (types("TimeoutError"), transient("timeout", "redis: timed out")),
        (types("ConnectionError"), transient("connection", "redis: connection failed or lost")),
    ])
    responses = types("ResponseError")

    def structure(exc: BaseException) -> Classification | None:
        verdict = typed(exc) if typed else None
        if verdict is None and responses and isinstance(exc, responses):
            # A reply code the client has no class for still starts the message (``BUSY Redis is busy ...``).
            text = str(exc)
            if text.startswith(_TRANSIENT_REPLY_CODES):
                return transient("resource_exhausted", f"redis: {text.split(' ', 1)[0]} reply")
            return permanent("client_error", "redis: the command was refused")
        return verdict

    return Family(structure=structure)
