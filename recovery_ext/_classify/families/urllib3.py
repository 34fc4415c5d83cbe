"""urllib3: timeouts, bad URLs, and what its retry helper gave up on.

``MaxRetryError`` wraps the last failure as ``reason`` (walked as a cause). A ``ResponseError``
reason says why retries ran out: "too many redirects" is a redirect loop (permanent); "too many
503 error responses" carries the status that decides.
"""

from __future__ import annotations

import re

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, http_classification, permanent, transient

_TOO_MANY_STATUS = re.compile(r"too many (\d{3}) error responses")


def family() -> Family:
    module = "urllib3.exceptions"
    response_errors = loaded_types(module, "ResponseError")
    typed = by_type([
        (loaded_types(module, "TimeoutError"), transient("timeout", "urllib3: timed out")),
        (loaded_types(module, "LocationValueError", "LocationParseError", "URLSchemeUnknown"),
         permanent("configuration", "urllib3: bad URL or scheme")),
        (loaded_types(module, "DecodeError"), permanent("protocol", "urllib3: the body could not be decoded")),
    ])

    def structure(exc: BaseException) -> Classification | None:
        if response_errors and isinstance(exc, response_errors):
            text = str(exc)
            status = _TOO_MANY_STATUS.search(text)
            if status:
                return http_classification(int(status.group(1)), f"urllib3: {text}")
            if "redirect" in text:
                return permanent("configuration", "urllib3: too many redirects")
        return typed(exc) if typed else None

    return Family(
        structure=structure,
        wrapper=by_type([(loaded_types(module, "ProtocolError", "NewConnectionError", "MaxRetryError"),
                          transient("connection", "urllib3: the request did not get through"))]),
    )
