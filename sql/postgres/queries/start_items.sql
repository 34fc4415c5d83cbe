-- ctx.items(keys) starting: the fence, the node's item count and the statuses already checkpointed.
-- The first row says whether the fence held; the others are the items. The update runs even though
-- the final SELECT does not read it (PostgreSQL always runs data-modifying CTEs).
WITH fence AS (
    SELECT p.id FROM rx_pipelines p
    WHERE p.id = %(pipeline_id)s::bigint AND p.epoch = %(epoch)s::integer AND p.status = 'running'
    FOR KEY SHARE
), counted AS (
    UPDATE rx_nodes n SET items_total = %(total)s::integer
    WHERE n.pipeline_id = (SELECT id FROM fence) AND n.name = %(node)s::text
    RETURNING n.id
)
SELECT 0 AS position, (SELECT count(*) FROM fence)::integer AS fenced, NULL::text AS item_key, NULL::text AS status
UNION ALL
SELECT 1, 1, i.item_key, i.status FROM rx_node_items i JOIN fence ON i.pipeline_id = fence.id
WHERE i.node_name = %(node)s::text
ORDER BY position
