-- A checkpoint statement's end (included by checkpoint_*.sql with \ir): it follows a CTE named written.
-- progress: the stall-deadline push (_checkpoint_progress.sql).
-- The final SELECT returns how many items were written, and fails with SQLSTATE RX409 (rx_superseded, migration
--   0009) when the fence found no row, so a superseded owner's statement aborts, and so does a COMMIT sent in
--   the same round trip.
\ir _checkpoint_progress.sql
SELECT CASE WHEN EXISTS (SELECT FROM fence) THEN (SELECT count(*) FROM written)
            ELSE rx_superseded(%(pipeline)s, %(epoch)s) END AS written
