-- Heartbeats as HOT updates: PostgreSQL updates a row in place (no new index entries) only
-- when no indexed column changes and the page has room. The live-row index covered
-- heartbeat_deadline, so every pulse wrote index entries; it now covers status and id only,
-- and the orphan scan filters the deadlines of the live rows it finds through it.
-- Node heartbeat columns were never indexed. A lower fillfactor keeps room on each page.
DROP INDEX rx_pipelines_live;
CREATE INDEX rx_pipelines_live ON rx_pipelines (status, id)
    WHERE status NOT IN ('completed', 'failed');
ALTER TABLE rx_pipelines SET (fillfactor = 80);
ALTER TABLE rx_nodes SET (fillfactor = 80);
