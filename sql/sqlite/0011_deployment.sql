-- Which deployment (one Dagster instance) owns a pipeline: only that deployment's sensors reclaim,
-- resume, stop or give it up, so two deployments sharing these tables never both resume one crash.
-- Rows from before deployments existed belong to the deployment named 'default'.
ALTER TABLE rx_pipelines ADD COLUMN deployment TEXT NOT NULL DEFAULT 'default';
