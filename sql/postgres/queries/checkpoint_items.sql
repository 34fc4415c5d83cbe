-- Item checkpoints (a batch, or one item as a batch of one) in ONE statement: the items arrive
-- as three bound arrays.
-- fence: the pipeline row, locked FOR KEY SHARE (like PipelineOps._fence), only while this
--   owner's epoch holds it; every write below reads from it, so a superseded owner writes nothing.
-- written: the new items, and degraded ones (a fallback answer) redone; a completed item is never
--   overwritten.
-- refused: the items neither written nor redone, inserted again without ON CONFLICT: the primary key
--   refuses them (unique_violation), which aborts the whole statement, so a batch naming a completed
--   item writes nothing at all, not even in autocommit mode.
-- progress: the stall-deadline push when the caller gives a stall timeout.
-- calls: the provider calls made for these items (the ledger, rx_provider_calls), written through the
--   fence, so they commit with the items or not at all; the answered ones reached this checkpoint.
-- The final SELECT fails with SQLSTATE RX409 (rx_superseded, migration 0009) when the fence found no
--   row, so a superseded owner's statement aborts, and so does a COMMIT sent in the same round trip.
-- The arrays are bound in binary format (the b placeholders): no per-element text escaping in psycopg.
WITH fence AS (
    SELECT id FROM rx_pipelines
    WHERE id = %(pipeline)s AND epoch = %(epoch)s AND status = 'running'
    FOR KEY SHARE
), items AS (
    SELECT * FROM unnest(%(keys)b::text[], %(statuses)b::text[], %(results)b::text[]) AS u(item_key, status, result)
), written AS (
    INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
    SELECT fence.id, %(node)s, items.item_key, items.status, items.result::jsonb, %(owner)s, %(epoch)s, now()
    FROM fence, items
    ON CONFLICT (pipeline_id, node_name, item_key) DO UPDATE
        SET status = excluded.status, result = excluded.result, run_id = excluded.run_id,
            epoch = excluded.epoch, completed_at = excluded.completed_at
        WHERE rx_node_items.status = 'degraded'
    RETURNING item_key
), refused AS (
    INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, run_id, epoch, completed_at)
    SELECT fence.id, %(node)s, items.item_key, items.status, %(owner)s, %(epoch)s, now()
    FROM fence, items
    WHERE items.item_key NOT IN (SELECT item_key FROM written)
), calls AS (
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
), progress AS (
    UPDATE rx_nodes SET stall_deadline = now() + make_interval(secs => %(stall)s::float8)
    WHERE %(stall)s::float8 IS NOT NULL
      AND pipeline_id = (SELECT id FROM fence) AND name = %(node)s AND status = 'running'
)
SELECT CASE WHEN EXISTS (SELECT FROM fence) THEN (SELECT count(*) FROM written)
            ELSE rx_superseded(%(pipeline)s, %(epoch)s) END AS written
