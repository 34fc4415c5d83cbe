-- A checkpoint statement's end (included by checkpoint_*.sql with \ir): it follows a CTE named written.
-- progress: the stall-deadline push when the caller gives a stall timeout (stall): only when less than that is
--   left, and then to stall_to from now, a tenth more (pipelines.stall_push): the deadline is indexed, so each
--   push writes a new version of the node's row and of its index entries, about ten per stall timeout instead
--   of one per item, and the node is still never found stalled sooner than stall after its last progress.
-- The final SELECT returns how many items were written, and fails with SQLSTATE RX409 (rx_superseded, migration
--   0009) when the fence found no row, so a superseded owner's statement aborts, and so does a COMMIT sent in
--   the same round trip.
, progress AS (
    UPDATE rx_nodes SET stall_deadline = now() + make_interval(secs => %(stall_to)s::float8)
    WHERE %(stall)s::float8 IS NOT NULL
      AND pipeline_id = (SELECT id FROM fence) AND name = %(node)s AND status = 'running'
      AND (stall_deadline IS NULL OR stall_deadline < now() + make_interval(secs => %(stall)s::float8))
)
SELECT CASE WHEN EXISTS (SELECT FROM fence) THEN (SELECT count(*) FROM written)
            ELSE rx_superseded(%(pipeline)s, %(epoch)s) END AS written
