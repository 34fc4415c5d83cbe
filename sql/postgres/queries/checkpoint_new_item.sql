-- One item checkpoint that keeps no provider call, for an item that has no row yet: the usual case of an item
-- checkpointed alone. checkpoint_new_items.sql with scalars in place of its 13 arrays and without the ledger's
-- CTE: binding and unnesting empty arrays cost about a fifth of a one-item checkpoint's time (measured).
-- An item that has a row already makes the primary key fail the statement (unique_violation), so it writes
-- nothing; the store then runs checkpoint_items.sql, which decides item by item.
-- The fence and the end are the shared parts below (_checkpoint_*.sql).
\ir _checkpoint_fence.sql
, written AS (
    INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
    SELECT fence.id, %(node)s, %(key)s, %(status)s, %(result)s::jsonb, %(owner)s, %(epoch)s, now()
    FROM fence
    RETURNING 1
)
\ir _checkpoint_tail.sql
