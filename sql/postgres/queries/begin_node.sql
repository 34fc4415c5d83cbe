-- A node's start: rx_begin_node (migrations 0008 and 0014) finds the running pipeline the run owns and
-- returns the node as recorded (finished: skipped by a resume) or starts it. One round trip.
SELECT r.outcome, r.pipeline, r.pipeline_epoch, r.from_status, (r.node).*
FROM rx_begin_node(%(run_id)s::text, %(name)s::text, %(sources)s::text[], %(heartbeat_timeout)s::float8,
                   %(stall_timeout)s::float8, %(retry)s::boolean, %(process)s::text,
                   %(watcher)s::text) AS r
