"""pymongo: a server error's numeric ``code`` decides where no error label does (labels, ``timeout`` and
``AutoReconnect`` are read generically): the codes pymongo itself retries, a write conflict, a lock or a
throttled request are transient; the others name a mistake."""

from __future__ import annotations

import sys

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient

# Beyond the codes pymongo retries (read from it when present): WriteConflict, LockTimeout, LockBusy,
# a cursor or query killed by a step-down, and a throttled request (Cosmos DB's RequestRateTooLarge).
_TRANSIENT = {112: "database_transient", 24: "database_transient", 46: "database_transient",
              175: "database_transient", 237: "database_transient", 50: "timeout", 16500: "rate_limit"}
_PERMANENT = {11000: "validation", 11001: "validation", 121: "validation", 13: "auth", 18: "auth", 26: "not_found"}


def family() -> Family:
    failures = loaded_types("pymongo.errors", "OperationFailure")
    shared = sys.modules.get("pymongo.helpers_shared")
    retried: frozenset[int] = getattr(shared, "_RETRYABLE_ERROR_CODES", frozenset())

    def facts(exc: BaseException) -> Classification | None:
        code = getattr(exc, "code", None) if failures and isinstance(exc, failures) else None
        if not isinstance(code, int) or isinstance(code, bool):
            return None
        if code in retried or code in _TRANSIENT:
            return transient(_TRANSIENT.get(code, "database_transient"), f"MongoDB error {code}")
        return permanent(_PERMANENT.get(code, "client_error"), f"MongoDB error {code}")

    return Family(facts=facts, structure=by_type([
        (loaded_types("pymongo.errors", "AutoReconnect"),
         transient("connection", "pymongo: reconnect (NotPrimaryError, a lost connection)")),
        (loaded_types("pymongo.errors", "ConfigurationError", "InvalidURI", "InvalidName"),
         permanent("configuration", "pymongo: bad configuration")),
    ]))
