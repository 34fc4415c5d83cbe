-- A batch of journal answers as one statement: rx_journal_answer (migration 0018) for each element of the
-- writes, in their order, each fencing itself as alone. One row per element, as journal_answer.sql returns it.
-- The writes arrive as ONE jsonb array of objects: binding one array per column cost the client about 5 us per
-- column and statement, most of a small batch's client time (with 64 threads a batch holds a write or two).
SELECT r.verdict, r.pipeline_owner, r.pipeline_epoch, r.pipeline_status
FROM ROWS FROM (jsonb_to_recordset(%(writes)s::jsonb)
                AS (node text, item text, call_key text, id text, answer text, model text, tokens_in bigint,
                    tokens_out bigint, latency_seconds float8, outcome text, cost float8, note text))
     WITH ORDINALITY AS w(node, item, call_key, id, answer, model, tokens_in, tokens_out, latency_seconds, outcome,
                          cost, note, n)
CROSS JOIN LATERAL rx_journal_answer(%(fence_pipeline)s::bigint, %(fence_epoch)s::integer, w.node, w.item,
                                     w.call_key, w.id, w.answer, %(in_flight)s::text, w.model, w.tokens_in,
                                     w.tokens_out, w.latency_seconds, w.outcome, w.cost, w.note) AS r
ORDER BY w.n
