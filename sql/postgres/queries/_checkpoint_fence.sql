-- A checkpoint statement's first CTE (included by checkpoint_*.sql with \ir).
-- fence: the pipeline row, locked FOR KEY SHARE, only while this owner's epoch holds it; every write after it
--   reads from it, so a superseded owner writes nothing. The lock is held to the commit, so a reclaim (FOR
--   UPDATE SKIP LOCKED) cannot slip in between; it is the only lock a worker takes on that row, never upgraded.
WITH fence AS (
    SELECT id FROM rx_pipelines
    WHERE id = %(pipeline)s AND epoch = %(epoch)s AND status = 'running'
    FOR KEY SHARE
)
