-- Which orphan sensor reserved a pipeline for its resume run. Only that sensor re-requests the
-- run while the pipeline waits for it (its run_key makes the request idempotent); another
-- sensor re-requesting the same run key would create a second resume run.
ALTER TABLE rx_pipelines ADD COLUMN launcher TEXT;
