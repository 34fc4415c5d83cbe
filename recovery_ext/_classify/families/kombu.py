"""kombu and py-amqp (Celery's broker clients): amqp's own recoverable/irrecoverable split, with a
broker's internal error transient and a message too large permanent; kombu's ``OperationalError``
is a transport wrapper (its cause says why)."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    amqp = partial(loaded_types, "amqp.exceptions")
    return Family(
        structure=by_type([
            (amqp("ContentTooLarge"), permanent("validation", "AMQP 311: content too large")),
            (amqp("ResourceLocked"), transient("database_transient", "AMQP 405: resource locked")),
            (amqp("InternalError"), transient("server_error", "AMQP 541: broker internal error")),
            (amqp("AccessRefused"), permanent("auth", "AMQP 403: access refused")),
            (amqp("NotFound"), permanent("not_found", "AMQP 404: not found")),
            (amqp("RecoverableConnectionError", "RecoverableChannelError"),
             transient("connection", "AMQP: recoverable broker error")),
            (amqp("IrrecoverableConnectionError", "IrrecoverableChannelError"),
             permanent("client_error", "AMQP: irrecoverable broker error")),
            (loaded_types("kombu.exceptions", "LimitExceeded"),
             transient("resource_exhausted", "kombu: limit exceeded")),
            (loaded_types("kombu.exceptions", "SerializationError", "NotBoundError", "VersionMismatch"),
             permanent("validation", "kombu: message or setup error")),
        ]),
        wrapper=by_type([(loaded_types("kombu.exceptions", "OperationalError") + amqp("ConnectionError"),
                          transient("connection", "kombu: the broker could not be reached"))]),
    )
