-- The same live-row index as on PostgreSQL (where it makes heartbeats HOT updates): status
-- and id only; the orphan scan filters the heartbeat deadlines of the live rows.
DROP INDEX rx_pipelines_live;
CREATE INDEX rx_pipelines_live ON rx_pipelines (status, id)
    WHERE status NOT IN ('completed', 'failed');
