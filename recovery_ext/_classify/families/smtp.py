"""smtplib: the reply code decides (4xx: try again later; 5xx: refused for good); a dropped
connection is transient. Refused recipients are transient only when every refusal is a 4xx."""

from __future__ import annotations

from functools import partial

from recovery_ext._classify.families import Family, by_type, loaded_types
from recovery_ext._classify.verdict import Classification, permanent, transient


def reply(code: int, what: str) -> Classification:
    if 400 <= code < 500:
        return transient("server_error", f"SMTP {code}: {what} (temporary)")
    category = "auth" if code in (530, 534, 535, 538) else "not_found" if code in (550, 551, 553) else "client_error"
    return permanent(category, f"SMTP {code}: {what}")


def family() -> Family:
    types = partial(loaded_types, "smtplib")
    responses, refused = types("SMTPResponseException"), types("SMTPRecipientsRefused")

    def facts(exc: BaseException) -> Classification | None:
        if responses and isinstance(exc, responses):
            code = getattr(exc, "smtp_code", None)
            if isinstance(code, int) and 200 <= code <= 599:
                return reply(code, type(exc).__name__)
        if refused and isinstance(exc, refused):
            codes = [answer[0] for answer in (getattr(exc, "recipients", None) or {}).values()
                     if isinstance(answer, tuple) and answer and isinstance(answer[0], int)]
            if codes:
                worst = max(codes)
                return reply(worst, f"{len(codes)} recipient(s) refused")
        return None

    return Family(facts=facts, structure=by_type([
        (types("SMTPServerDisconnected"), transient("connection", "SMTP: the server disconnected")),
        (types("SMTPNotSupportedError"), permanent("configuration", "SMTP: the server does not support it")),
    ]))
