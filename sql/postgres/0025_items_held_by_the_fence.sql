-- An item checkpoint's pipeline is already proven and held by the checkpoint's fence: every statement that writes
-- rx_node_items (sql/postgres/queries/checkpoint_*.sql) selects the pipeline row, under its owner's epoch, FOR
-- KEY SHARE, and inserts nothing when that finds no row. The lock is held to the commit, so the pipeline cannot
-- be deleted in between (a DELETE waits for it, then deletes the items too, below). The foreign key checked the
-- same row again for every item: one more index probe and lock per row, about 30 % of a bare 1,000-row INSERT's
-- time (bench/batch_bench.py prints a bare INSERT with and without it).
-- Its ON DELETE CASCADE stays, as a trigger: a pipeline's delete deletes its items. It is named to run before
-- rx_pipeline_left_rows (triggers of one event run in name order, as the foreign key's did), so a delete that
-- takes its items with it notes nothing; and like the foreign key's, it is off under session_replication_role =
-- replica (a delete with the foreign keys off leaves the items, and rx_pipeline_left_rows notes them).
ALTER TABLE rx_node_items DROP CONSTRAINT rx_node_items_pipeline_id_fkey;

-- A deleter above READ COMMITTED deletes what its snapshot holds: items a checkpoint committed after that
-- snapshot was taken (its fence only made the delete wait) stay, where the foreign key's cascade would have failed
-- the delete with a serialization error. Such a delete of a running pipeline notes its id, so `status` (which
-- reads the latest data) lists whatever was left.
CREATE FUNCTION rx_pipeline_items_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM rx_node_items WHERE pipeline_id = OLD.id;
    IF OLD.status = 'running' AND current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO rx_deleted_pipelines (id) VALUES (OLD.id) ON CONFLICT (id) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER rx_pipeline_cascade_items AFTER DELETE ON rx_pipelines FOR EACH ROW
    EXECUTE FUNCTION rx_pipeline_items_deleted();
