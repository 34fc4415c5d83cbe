"""aiohttp: certificate and URL errors are permanent; timeouts, dropped connections and cut bodies are not."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def family() -> Family:
    types = partial(loaded_types, "aiohttp")
    return Family(
        structure=by_type([
            (types("ClientConnectorCertificateError", "ClientSSLError"), permanent("tls", "aiohttp: TLS failed")),
            (types("InvalidURL", "InvalidUrlClientError", "NonHttpUrlClientError"),
             permanent("configuration", "aiohttp: bad URL")),
            (types("ServerTimeoutError", "ConnectionTimeoutError", "SocketTimeoutError"),
             transient("timeout", "aiohttp: timed out")),
            (types("ServerDisconnectedError", "ClientPayloadError"),
             transient("connection", "aiohttp: the server dropped the connection or cut the body")),
        ]),
        wrapper=by_type([(types("ClientConnectionError"),
                          transient("connection", "aiohttp: the request did not get through"))]),
    )
