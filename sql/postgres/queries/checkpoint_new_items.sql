-- Item checkpoints of items that have no row yet (the usual case: a node's first run over them), in
-- ONE statement: checkpoint_items.sql without its ON CONFLICT clause and its refusal, which cost the
-- server about a quarter of a 1,000-item batch. The items arrive as three bound arrays (binary format).
-- An item that has a row already (degraded, to be redone, or completed, to be refused) makes the
-- primary key fail the statement (unique_violation), so it writes nothing; the store then runs
-- checkpoint_items.sql, which decides item by item.
-- fence: the pipeline row, locked FOR KEY SHARE, only while this owner's epoch holds it; a superseded
--   owner writes nothing, and the final SELECT fails with SQLSTATE RX409 (rx_superseded, migration 0009).
-- calls: the provider calls made for these items (the ledger), written through the fence, as in
--   checkpoint_items.sql.
-- progress: the stall-deadline push when the caller gives a stall timeout.
WITH fence AS (
    SELECT id FROM rx_pipelines
    WHERE id = %(pipeline)s AND epoch = %(epoch)s AND status = 'running'
    FOR KEY SHARE
), written AS (
    INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
    SELECT fence.id, %(node)s, u.item_key, u.status, u.result::jsonb, %(owner)s, %(epoch)s, now()
    FROM fence, unnest(%(keys)b::text[], %(statuses)b::text[], %(results)b::text[]) AS u(item_key, status, result)
    RETURNING 1
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
