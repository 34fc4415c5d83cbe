-- A checkpoint statement's ledger CTE (included by checkpoint_items.sql and checkpoint_new_items.sql with \ir).
-- calls: the provider calls made for these items (the ledger, rx_provider_calls), bound as ten arrays (binary
--   format), written through the fence, so they commit with the items or not at all; the answered ones
--   reached this checkpoint.
, calls AS (
    INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                                   tokens_out, latency_seconds, outcome, cost, reached_checkpoint, recorded_at,
                                   note)
    SELECT c.id, fence.id, %(node)s, c.item_key, %(owner)s, %(epoch)s, c.endpoint, c.model, c.tokens_in,
           c.tokens_out, c.latency, c.outcome, c.cost, c.outcome = 'ok', now(), c.note
    FROM fence, unnest(%(call_ids)b::text[], %(call_items)b::text[], %(call_endpoints)b::text[],
                       %(call_models)b::text[], %(call_tokens_in)b::int8[], %(call_tokens_out)b::int8[],
                       %(call_latencies)b::float8[], %(call_outcomes)b::text[], %(call_costs)b::float8[],
                       %(call_notes)b::text[])
         AS c(id, item_key, endpoint, model, tokens_in, tokens_out, latency, outcome, cost, note)
    ON CONFLICT (id) DO UPDATE SET reached_checkpoint = excluded.reached_checkpoint
)
