-- Before a journaled request leaves: rx_journal_begin (migration 0018) fences, hands back a journaled
-- answer with its paid call's ledger row, or writes the call's ledger row in flight. One round trip.
SELECT r.verdict, r.pipeline_owner, r.pipeline_epoch, r.pipeline_status, r.journaled_answer, (r.paid_call).*
FROM rx_journal_begin(%(fence_pipeline)s::bigint, %(fence_epoch)s::integer, %(node)s::text, %(item)s::text,
                      %(call_key)s::text, %(id)s::text, %(pipeline_id)s::bigint, %(node_name)s::text,
                      %(item_key)s::text, %(run_id)s::text, %(epoch)s::integer, %(endpoint)s::text,
                      %(model)s::text, %(tokens_in)s::bigint, %(tokens_out)s::bigint,
                      %(latency_seconds)s::float8, %(outcome)s::text, %(cost)s::float8,
                      %(reached_checkpoint)s::boolean, %(note)s::text) AS r
