-- One item checkpoint that keeps no provider call and pushes no stall deadline, for an item that has no row
-- yet: the usual case of an item checkpointed alone. One INSERT ... SELECT, without the CTEs of the batch
-- statements (checkpoint_new_items.sql): with them, a one-item checkpoint cost the server about a seventh
-- more (measured against a plain INSERT into rx_node_items).
-- The fence is _checkpoint_fence.sql's: the pipeline row, locked FOR KEY SHARE to the commit, only while this
-- owner's epoch holds it. A superseded owner's statement selects no row, so it inserts none: the store reads
-- a row count of 0 as superseded. An item that has a row already makes the primary key fail the statement
-- (unique_violation), so it writes nothing; the store then runs checkpoint_items.sql, which decides item by
-- item.
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
SELECT id, %(node)s, %(key)s, %(status)s, %(result)s::jsonb, %(owner)s, %(epoch)s, now()
FROM rx_pipelines
WHERE id = %(pipeline)s AND epoch = %(epoch)s AND status = 'running'
FOR KEY SHARE
