-- A checkpoint statement's stall-deadline CTE (included with \ir by _checkpoint_tail.sql and by
-- checkpoint_new_item_stall.sql): it follows the fence.
-- progress: the stall-deadline push when the caller gives a stall timeout (stall): only when less than that is
--   left, and then to stall_to from now, a tenth more (pipelines.stall_push): the deadline is indexed, so each
--   push writes a new version of the node's row and of its index entries, about ten per stall timeout instead
--   of one per item, and the node is still never found stalled sooner than stall after its last progress.
, progress AS (
    UPDATE rx_nodes SET stall_deadline = now() + make_interval(secs => %(stall_to)s::float8)
    WHERE %(stall)s::float8 IS NOT NULL
      AND pipeline_id = (SELECT id FROM fence) AND name = %(node)s AND status = 'running'
      AND (stall_deadline IS NULL OR stall_deadline < now() + make_interval(secs => %(stall)s::float8))
)
