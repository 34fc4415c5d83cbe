-- A node's completion: rx_complete_node (migration 0008), refused while items are unfinished.
SELECT r.outcome, r.status, r.owner, r.epoch, r.unfinished, r.total
FROM rx_complete_node(%(pipeline_id)s::bigint, %(epoch)s::integer, %(owner)s::text, %(name)s::text,
                      %(output)s::jsonb, %(sources)s::text[], %(item_statuses)s::text[],
                      %(heartbeat_timeout)s::float8, %(retry)s::boolean) AS r
