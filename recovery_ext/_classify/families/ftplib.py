"""ftplib: the reply code decides as SMTP's does (4xx: try again later; 5xx: refused for good)."""

from __future__ import annotations

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient


def family() -> Family:
    replies = loaded_types("ftplib", "error_reply", "error_temp", "error_perm", "error_proto")

    def facts(exc: BaseException) -> Classification | None:
        if not replies or not isinstance(exc, replies):
            return None
        text = str(exc)
        code = int(text[:3]) if text[:3].isdigit() else None
        if code is not None and 400 <= code < 500:
            return transient("server_error", f"FTP {code} (temporary)")
        if code is not None and code >= 500:
            return permanent("auth" if code == 530 else "not_found" if code == 550 else "client_error", f"FTP {code}")
        return None

    return Family(facts=facts, structure=by_type([
        (loaded_types("ftplib", "error_proto", "error_reply"), permanent("protocol", "FTP: unexpected reply")),
    ]))
