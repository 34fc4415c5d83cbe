-- SQLite: times are Unix epoch seconds (REAL) on the database clock.
-- Queue items are fenced by the epoch of the pipeline whose worker holds them, and a failed
-- item waits for its retry. NULL available_at means "claimable now" (every row before this one).

ALTER TABLE rx_queue_items ADD COLUMN available_at REAL;
ALTER TABLE rx_queue_items ADD COLUMN holder_pipeline_id BIGINT;
ALTER TABLE rx_queue_items ADD COLUMN holder_epoch INTEGER;

CREATE INDEX rx_queue_holder ON rx_queue_items (holder_pipeline_id) WHERE status = 'processing';
