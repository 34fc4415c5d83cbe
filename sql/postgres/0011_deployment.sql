-- Which deployment (one Dagster instance) owns a pipeline: only that deployment's sensors reclaim,
-- resume, stop or give it up, so two deployments sharing these tables never both resume one crash.
-- Rows from before deployments existed belong to the deployment named 'default'.
ALTER TABLE rx_pipelines ADD COLUMN deployment TEXT NOT NULL DEFAULT 'default';
-- A heartbeat pulse writes a new version of every row it beats, in one statement; to stay HOT (in
-- place, no index entries) a page must hold its rows twice. The wider row no longer fits that at
-- fillfactor 80 when a pulse beats a whole page: new pages keep half their room for the pulses.
ALTER TABLE rx_pipelines SET (fillfactor = 50);
