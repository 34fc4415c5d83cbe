-- Item checkpoints (a batch, or one item as a batch of one) in ONE statement: the items arrive as three JSON
-- arrays (_checkpoint_items.sql).
-- written: the new items, and degraded ones (a fallback answer) redone; a completed item is never overwritten.
-- refused: the items neither written nor redone, inserted again without ON CONFLICT: the primary key refuses
--   them (unique_violation), which aborts the whole statement, so a batch naming a completed item writes
--   nothing at all, not even in autocommit mode.
-- The fence, the ledger's calls and the end are the shared parts below (_checkpoint_*.sql).
\ir _checkpoint_fence.sql
\ir _checkpoint_items.sql
, written AS (
    INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
    SELECT fence.id, %(node)s, items.item_key, items.status, items.result, %(owner)s, %(epoch)s, now()
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
)
\ir _checkpoint_calls.sql
\ir _checkpoint_tail.sql
