"""websockets: a closed connection is transient unless its close code blames the message; a bad
URI or a handshake the peer refused is not (an ``InvalidStatus`` carries its HTTP status)."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient

# RFC 6455 7.4.1: protocol error, unsupported or invalid data, policy, too big, missing extension
_PERMANENT_CLOSE_CODES = {1002, 1003, 1007, 1008, 1009, 1010}


def family() -> Family:
    types = partial(loaded_types, "websockets.exceptions")
    closed = types("ConnectionClosed")
    typed = by_type([
        (types("InvalidURI", "InvalidProxy"), permanent("configuration", "websockets: bad URI")),
        (types("PayloadTooBig", "ProtocolError"), permanent("protocol", "websockets: protocol violation")),
        (types("InvalidHandshake"), permanent("protocol", "websockets: handshake refused")),
    ])

    def structure(exc: BaseException) -> Classification | None:
        if closed and isinstance(exc, closed):
            # the peer's close frame, or ours when we closed (1009: a message over our max_size)
            frame = getattr(exc, "rcvd", None) or getattr(exc, "sent", None)
            code = getattr(frame, "code", None)
            if code in _PERMANENT_CLOSE_CODES:
                return permanent("protocol", f"websockets: closed with code {code}")
            return transient("connection", f"websockets: connection closed ({code or 'no close frame'})")
        return typed(exc) if typed else None

    return Family(structure=structure)
