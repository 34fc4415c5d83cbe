"""urllib.request and http.client: malformed URLs and lines, and ``URLError`` as a transport wrapper."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    return Family(
        structure=by_type([(loaded_types("http.client", "InvalidURL", "LineTooLong"),
                            permanent("configuration", "http.client: bad URL or header line"))]),
        wrapper=by_type([(loaded_types("urllib.error", "URLError"),
                          transient("connection", "urllib: the request did not get through"))]),
    )
