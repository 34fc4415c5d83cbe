-- One new item that keeps no provider call and pushes the node's stall deadline (a node with stall_timeout set):
-- the usual item of such a node checkpointed alone. Its three scalars are bound as they are (as three
-- one-element JSON arrays, checkpoint_new_items_no_calls.sql's form, it cost the client a third more CPU), and the
-- statement is the INSERT itself, as checkpoint_new_item.sql is: it returns no row, and a superseded owner's
-- fence selects none, so it inserts none and the store reads a row count of 0 as superseded. The stall push is
-- a CTE that runs whether or not the INSERT reads it (PostgreSQL runs each data-modifying CTE once, to the end).
-- An item that has a row already makes the primary key fail the statement (unique_violation), so it writes
-- nothing; the store then runs checkpoint_items.sql, which decides item by item.
\ir _checkpoint_fence.sql
\ir _checkpoint_progress.sql
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
SELECT fence.id, %(node)s, %(key)s, %(status)s, %(result)s::jsonb, %(owner)s, %(epoch)s, now()
FROM fence
