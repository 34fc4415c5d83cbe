-- A batch of journal answers as one statement: rx_journal_answer (migration 0018) for each element of the
-- arrays, in their order, each fencing itself as alone. One row per element, as journal_answer.sql returns it.
SELECT r.verdict, r.pipeline_owner, r.pipeline_epoch, r.pipeline_status
FROM unnest(%(node)s::text[], %(item)s::text[], %(call_key)s::text[], %(id)s::text[], %(answer)s::text[],
            %(model)s::text[], %(tokens_in)s::bigint[], %(tokens_out)s::bigint[], %(latency_seconds)s::float8[],
            %(outcome)s::text[], %(cost)s::float8[], %(note)s::text[])
     WITH ORDINALITY AS w(node, item, call_key, id, answer, model, tokens_in, tokens_out, latency_seconds, outcome,
                          cost, note, n)
CROSS JOIN LATERAL rx_journal_answer(%(fence_pipeline)s::bigint, %(fence_epoch)s::integer, w.node, w.item,
                                     w.call_key, w.id, w.answer, %(in_flight)s::text, w.model, w.tokens_in,
                                     w.tokens_out, w.latency_seconds, w.outcome, w.cost, w.note) AS r
ORDER BY w.n
