"""pika (RabbitMQ): a broker's close carries an AMQP reply code (``reply_code``), which decides: 320
connection forced (the broker is shutting down), 405 resource locked, 506 resource error and 541 internal
error are transient; the others name a mistake in the request. A lost stream is transient."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient

AMQP_TRANSIENT = {320: ("connection", "connection forced"), 405: ("database_transient", "resource locked"),
                  506: ("resource_exhausted", "resource error"), 541: ("server_error", "internal error")}
AMQP_PERMANENT = {402: "validation", 403: "auth", 404: "not_found", 406: "validation", 311: "validation",
                  313: "validation", 530: "auth", 501: "protocol", 502: "protocol", 503: "protocol", 504: "protocol",
                  505: "protocol", 540: "client_error"}


def family() -> Family:
    closed = loaded_types("pika.exceptions", "ConnectionClosed", "ChannelClosed")

    def facts(exc: BaseException) -> Classification | None:
        code = getattr(exc, "reply_code", None) if closed and isinstance(exc, closed) else None
        if not isinstance(code, int) or isinstance(code, bool) or code in (0, 200):
            return None
        if code in AMQP_TRANSIENT:
            category, what = AMQP_TRANSIENT[code]
            return transient(category, f"AMQP {code}: {what}")
        return permanent(AMQP_PERMANENT.get(code, "client_error"), f"AMQP {code}")

    lost = by_type([(loaded_types("pika.exceptions", "StreamLostError", "ConnectionWrongStateError"),
                     transient("connection", "pika: the connection to the broker was lost"))])
    handshake = loaded_types("pika.exceptions", "IncompatibleProtocolError")

    def structure(exc: BaseException) -> Classification | None:
        # the stream was lost during the protocol handshake: pika keeps only its name, as text
        if handshake and isinstance(exc, handshake) and "StreamLostError" in str(exc):
            return transient("connection", "pika: the broker hung up during the handshake")
        return lost(exc) if lost else None

    return Family(facts=facts, structure=structure)
