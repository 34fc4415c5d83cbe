-- A journaled answer arrived: rx_journal_answer (migration 0018) fences, keeps the answer and completes
-- the call's ledger row. One round trip.
SELECT r.verdict, r.pipeline_owner, r.pipeline_epoch, r.pipeline_status
FROM rx_journal_answer(%(fence_pipeline)s::bigint, %(fence_epoch)s::integer, %(node)s::text, %(item)s::text,
                       %(call_key)s::text, %(id)s::text, %(answer)s::text, %(in_flight)s::text,
                       %(model)s::text, %(tokens_in)s::bigint, %(tokens_out)s::bigint,
                       %(latency_seconds)s::float8, %(outcome)s::text, %(cost)s::float8, %(note)s::text) AS r
