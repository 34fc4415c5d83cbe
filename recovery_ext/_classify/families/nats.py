"""nats-py: no server reachable, no responder on a subject (the service is between instances), a
stale, closed or reconnecting connection and a full outbound buffer are transient."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    types = partial(loaded_types, "nats.errors")
    return Family(structure=by_type([
        (types("NoServersError", "ConnectionClosedError", "StaleConnectionError", "ConnectionReconnectingError",
               "UnexpectedEOF"), transient("connection", "NATS: no connection to a server")),
        (types("NoRespondersError"), transient("server_error", "NATS: no responder on the subject yet")),
        (types("OutboundBufferLimitError", "SlowConsumerError"), transient("resource_exhausted", "NATS: buffer full")),
        (types("AuthorizationError", "InvalidUserCredentialsError"), permanent("auth", "NATS: not authorized")),
        (types("MaxPayloadError", "BadSubjectError", "BadHeaderError"), permanent("validation", "NATS: bad message")),
    ]))
