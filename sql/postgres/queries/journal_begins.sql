-- A batch of journal begins (the requests of a node's items in flight, gathered by the journal's group commit)
-- as one statement: rx_journal_begin (migration 0018) for each element of the arrays, in their order, each
-- fencing itself as alone. One row per element, as journal_begin.sql returns it. Binding arrays costs the
-- client one parameter per column, not one statement per write.
SELECT r.verdict, r.pipeline_owner, r.pipeline_epoch, r.pipeline_status, r.journaled_answer, (r.paid_call).*
FROM unnest(%(node)s::text[], %(item)s::text[], %(call_key)s::text[], %(id)s::text[], %(pipeline_id)s::bigint[],
            %(node_name)s::text[], %(item_key)s::text[], %(run_id)s::text[], %(epoch)s::integer[],
            %(endpoint)s::text[], %(model)s::text[], %(tokens_in)s::bigint[], %(tokens_out)s::bigint[],
            %(latency_seconds)s::float8[], %(outcome)s::text[], %(cost)s::float8[],
            %(reached_checkpoint)s::boolean[], %(note)s::text[])
     WITH ORDINALITY AS w(node, item, call_key, id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model,
                          tokens_in, tokens_out, latency_seconds, outcome, cost, reached_checkpoint, note, n)
CROSS JOIN LATERAL rx_journal_begin(%(fence_pipeline)s::bigint, %(fence_epoch)s::integer, w.node, w.item,
                                    w.call_key, w.id, w.pipeline_id, w.node_name, w.item_key, w.run_id, w.epoch,
                                    w.endpoint, w.model, w.tokens_in, w.tokens_out, w.latency_seconds, w.outcome,
                                    w.cost, w.reached_checkpoint, w.note) AS r
ORDER BY w.n
