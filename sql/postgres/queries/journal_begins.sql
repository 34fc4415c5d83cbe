-- A batch of journal begins (the requests of a node's items in flight, gathered by the journal's group commit)
-- as one statement: rx_journal_begin (migration 0018) for each element of the writes, in their order, each
-- fencing itself as alone. One row per element, as journal_begin.sql returns it.
-- The writes arrive as ONE jsonb array of objects: binding one array per column cost the client about 5 us per
-- column and statement, most of a small batch's client time (with 64 threads a batch holds a write or two).
SELECT r.verdict, r.pipeline_owner, r.pipeline_epoch, r.pipeline_status, r.journaled_answer, (r.paid_call).*
FROM ROWS FROM (jsonb_to_recordset(%(writes)s::jsonb)
                AS (node text, item text, call_key text, id text, pipeline_id bigint, node_name text, item_key text,
                    run_id text, epoch integer, endpoint text, model text, tokens_in bigint, tokens_out bigint,
                    latency_seconds float8, outcome text, cost float8, reached_checkpoint boolean, note text))
     WITH ORDINALITY AS w(node, item, call_key, id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model,
                          tokens_in, tokens_out, latency_seconds, outcome, cost, reached_checkpoint, note, n)
CROSS JOIN LATERAL rx_journal_begin(%(fence_pipeline)s::bigint, %(fence_epoch)s::integer, w.node, w.item,
                                    w.call_key, w.id, w.pipeline_id, w.node_name, w.item_key, w.run_id, w.epoch,
                                    w.endpoint, w.model, w.tokens_in, w.tokens_out, w.latency_seconds, w.outcome,
                                    w.cost, w.reached_checkpoint, w.note) AS r
ORDER BY w.n
