"""httpx and httpcore (and the ``httpx2``/``httpcore2`` forks some SDKs vendor: their errors mean the same)."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import permanent, transient


def _both(module: str, *names: str) -> tuple[type, ...]:
    renamed = module.replace("httpx", "httpx2").replace("httpcore", "httpcore2")
    return loaded_types(module, *names) + loaded_types(renamed, *names)


def family() -> Family:
    timeouts = _both("httpx", "TimeoutException") + _both("httpcore", "TimeoutException")
    misconfigured = (_both("httpx", "UnsupportedProtocol", "InvalidURL", "TooManyRedirects", "LocalProtocolError")
                     + _both("httpcore", "UnsupportedProtocol", "LocalProtocolError"))
    wrappers = _both("httpx", "TransportError") + _both("httpcore", "NetworkError", "RemoteProtocolError")
    return Family(
        structure=by_type([
            (timeouts, transient("timeout", "httpx: timed out")),
            (misconfigured, permanent("configuration", "httpx: bad URL, scheme, header or redirect loop")),
        ]),
        wrapper=by_type([(wrappers, transient("connection", "httpx: the request did not get through"))]),
    )
