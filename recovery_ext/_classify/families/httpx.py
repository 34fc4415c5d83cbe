"""httpx and httpcore (and the ``httpx2``/``httpcore2`` forks some SDKs vendor: their errors mean the same).

A status error whose body was read is judged by the provider's error type in it first (LLMResource's transport
reads every answer before the SDK sees it), then by its status."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.families.llm_errors import judge_response_body
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
        facts=judge_response_body(_both("httpx", "HTTPStatusError")),
        structure=by_type([
            (timeouts, transient("timeout", "httpx: timed out")),
            (misconfigured, permanent("configuration", "httpx: bad URL, scheme, header or redirect loop")),
        ]),
        wrapper=by_type([(wrappers, transient("connection", "httpx: the request did not get through"))]),
    )
