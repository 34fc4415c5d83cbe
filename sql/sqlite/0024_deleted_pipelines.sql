-- `status` lists rows that point at a pipeline that is gone (written with the foreign keys off, which is how a
-- plain sqlite3 connection writes, or a pipeline deleted by hand: its queue items have no foreign key). It found
-- them by walking the pipelines' primary key for the ranges of ids no pipeline has, a read that grew with the
-- history. A pipeline deleted while such rows still point at it is noted here instead, by the delete itself, so
-- `status` looks only at these ids and beyond the first and the last pipeline. A prune deletes a pipeline's nodes
-- and items before the pipeline: it notes nothing, unless the pipeline still held a queue item (then that item is
-- left pointing at nothing, and is listed).
CREATE TABLE rx_deleted_pipelines (
    id INTEGER PRIMARY KEY
);

-- Three index probes per deleted pipeline (the rows' pipeline indexes), in the deleting transaction.
CREATE TRIGGER rx_pipeline_left_rows AFTER DELETE ON rx_pipelines FOR EACH ROW
    WHEN EXISTS (SELECT 1 FROM rx_nodes WHERE pipeline_id = OLD.id)
      OR EXISTS (SELECT 1 FROM rx_node_items WHERE pipeline_id = OLD.id)
      OR EXISTS (SELECT 1 FROM rx_queue_items WHERE holder_pipeline_id = OLD.id AND status = 'processing')
BEGIN
    INSERT OR IGNORE INTO rx_deleted_pipelines (id) VALUES (OLD.id);
END;

-- What was left pointing at nothing before this migration, found once as `status` used to find it: the ranges of
-- ids between pipelines that no pipeline has, through each table's pipeline index.
INSERT INTO rx_deleted_pipelines (id)
WITH ids AS (SELECT id, lead(id) OVER (ORDER BY id) AS next FROM rx_pipelines),
     gaps AS (SELECT id + 1 AS lo, next - 1 AS hi FROM ids WHERE next > id + 1)
SELECT n.pipeline_id FROM gaps JOIN rx_nodes n ON n.pipeline_id BETWEEN gaps.lo AND gaps.hi
UNION
SELECT i.pipeline_id FROM gaps JOIN rx_node_items i ON i.pipeline_id BETWEEN gaps.lo AND gaps.hi
UNION
SELECT q.holder_pipeline_id FROM gaps JOIN rx_queue_items q ON q.holder_pipeline_id BETWEEN gaps.lo AND gaps.hi
 WHERE q.status = 'processing';
