-- New items that keep no provider call and push no stall deadline (the usual batch of ctx.items(batch=N)), in
-- ONE statement: checkpoint_new_items.sql without the ledger's CTE (and its JSON array, bound even when empty),
-- the stall push and the CTE that counts what was written.
-- The fence and the items are the shared parts (_checkpoint_fence.sql, _checkpoint_items.sql; the items CTE,
-- referenced once, is inlined by the planner). A superseded owner's fence selects no row, so the INSERT
-- writes none: the store reads a row count of 0 as superseded. An item that has a row already makes the
-- primary key fail the statement (unique_violation), so it writes nothing; the store then runs
-- checkpoint_items.sql, which decides item by item.
\ir _checkpoint_fence.sql
\ir _checkpoint_items.sql
INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
SELECT fence.id, %(node)s, items.item_key, items.status, items.result, %(owner)s, %(epoch)s, now()
FROM fence, items
