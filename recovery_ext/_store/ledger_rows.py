"""Which ledger rows the reports may sum: one corrupt row must never stop the figures of all the others.

A row written by this code always holds counts and a cost within bounds. A row written some other way
(an older release, a hand edit, SQLite's loose typing: an infinite or textual token count, a NaN cost)
is left out of every sum, counted, and the count is shown wherever the figures are (``costs``, the
metrics, the report), so nothing is silently lost.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Connection, and_, func, not_, or_, select

from recovery_ext._store.models import MAX_TOKENS
from recovery_ext._store.schema import provider_calls

pc = provider_calls.c

# Prices are at most one currency unit a token, so no well-formed call costs more than its tokens.
MAX_COST = float(2 * MAX_TOKENS)
MAX_LATENCY = 1e9  # seconds; a row's latency is not summed, but a listing of calls reads it back


def well_formed_call() -> ColumnElement[bool]:
    """True for a ledger row whose figures can be summed. On SQLite an infinite REAL or a TEXT value fails
    the BETWEEN (TEXT sorts above every number); on PostgreSQL NaN sorts above every number too."""
    return and_(pc.tokens_in.between(0, MAX_TOKENS), pc.tokens_out.between(0, MAX_TOKENS),
                or_(pc.cost.is_(None), pc.cost.between(0.0, MAX_COST)),
                pc.latency_seconds.between(0.0, MAX_LATENCY))


def malformed_calls(conn: Connection, pipeline_id: int | None = None) -> int:
    """How many ledger rows (of one pipeline) the sums leave out."""
    query = select(func.count()).select_from(provider_calls).where(not_(well_formed_call()))
    if pipeline_id is not None:
        query = query.where(pc.pipeline_id == pipeline_id)
    return int(conn.scalar(query) or 0)


SKIPPED_NOTE = "ledger row(s) left out of the figures: corrupt token counts or cost (e.g. infinite, negative, text)"
