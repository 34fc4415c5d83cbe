-- A checkpoint statement's ledger CTE (included by checkpoint_items.sql and checkpoint_new_items.sql with \ir).
-- calls: the provider calls made for these items (the ledger, rx_provider_calls), bound as ONE JSON array of
--   objects (as the journal's batches bind their writes): ten binary arrays, one per column, cost the client a
--   dumper look-up each even when empty, about a quarter of a one-item checkpoint's client CPU when it pushes a
--   stall deadline. Written through the fence, so they commit with the items or not at all; the answered ones
--   reached this checkpoint.
, calls AS (
    INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                                   tokens_out, latency_seconds, outcome, cost, reached_checkpoint, recorded_at,
                                   note)
    SELECT c.id, fence.id, %(node)s, c.item_key, %(owner)s, %(epoch)s, c.endpoint, c.model, c.tokens_in,
           c.tokens_out, c.latency_seconds, c.outcome, c.cost, c.outcome = 'ok', now(), c.note
    FROM fence, jsonb_to_recordset(%(calls)s::jsonb)
         AS c(id text, item_key text, endpoint text, model text, tokens_in int8, tokens_out int8,
              latency_seconds float8, outcome text, cost float8, note text)
    ON CONFLICT (id) DO UPDATE SET reached_checkpoint = excluded.reached_checkpoint
)
