"""requests: its timeouts, its misconfigurations, and its connection wrapper."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    exc = "exceptions."
    return Family(
        structure=by_type([
            (loaded_types("requests", exc + "Timeout"), transient("timeout", "requests: timed out")),
            (loaded_types("requests", *(exc + n for n in ("InvalidURL", "InvalidSchema", "MissingSchema",
                                                           "InvalidHeader", "TooManyRedirects", "URLRequired"))),
             permanent("configuration", "requests: bad URL, scheme, header or redirect loop")),
        ]),
        wrapper=by_type([(loaded_types("requests", exc + "ConnectionError"),
                          transient("connection", "requests: the request did not get through"))]),
    )
