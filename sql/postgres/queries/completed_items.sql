-- The checkpointed items of a node and their results (what a resume skips).
SELECT item_key, result FROM rx_node_items WHERE pipeline_id = %(pipeline_id)s::bigint AND node_name = %(node)s::text
