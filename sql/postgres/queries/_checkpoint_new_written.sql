-- A new-items checkpoint statement's INSERT CTE (included by checkpoint_new_items*.sql with \ir, after the items).
-- written: the items, inserted without ON CONFLICT: an item that has a row already fails the whole statement.
, written AS (
    INSERT INTO rx_node_items (pipeline_id, node_name, item_key, status, result, run_id, epoch, completed_at)
    SELECT fence.id, %(node)s, items.item_key, items.status, items.result, %(owner)s, %(epoch)s, now()
    FROM fence, items
    RETURNING 1
)
