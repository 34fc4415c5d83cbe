-- Liveness corroborated by the process that knows: a step process records which process it is
-- (process) and which process watches it (watcher: its run worker, or its Celery worker's main
-- process). The watcher checks those processes every pulse and either vouches for the node
-- (vouched_until) or reports it dead (died_at). A node whose own heartbeat expired but which
-- is vouched for is slow, not dead. None of these columns is indexed, so the watcher's writes
-- stay HOT updates; the watcher finds its nodes through rx_nodes_running.
ALTER TABLE rx_nodes ADD COLUMN process TEXT;
ALTER TABLE rx_nodes ADD COLUMN watcher TEXT;
ALTER TABLE rx_nodes ADD COLUMN vouched_until TIMESTAMPTZ;
ALTER TABLE rx_nodes ADD COLUMN died_at TIMESTAMPTZ;
-- Node rows are wider now and beaten twice per interval (their own pulse and their watcher's): like
-- rx_pipelines (migration 0011), new pages keep half their room, so a pulse over a whole page of
-- nodes still updates every row in place.
ALTER TABLE rx_nodes SET (fillfactor = 50);

-- A node's start records its process and its watcher in the same call: rx_begin_node with two
-- more arguments starts the node as before (migration 0008) and then names them.
CREATE FUNCTION rx_begin_node(p_run_id TEXT, p_name TEXT, p_sources TEXT[], p_heartbeat_timeout DOUBLE PRECISION,
                              p_stall_timeout DOUBLE PRECISION, p_retry BOOLEAN, p_process TEXT, p_watcher TEXT)
RETURNS TABLE (outcome TEXT, pipeline BIGINT, pipeline_epoch INTEGER, from_status TEXT, node rx_nodes)
LANGUAGE plpgsql AS $$
DECLARE
    v_begun RECORD;
    v_node rx_nodes;
BEGIN
    SELECT * INTO v_begun
      FROM rx_begin_node(p_run_id, p_name, p_sources, p_heartbeat_timeout, p_stall_timeout, p_retry) AS b;
    v_node := v_begun.node;
    IF v_begun.outcome = 'started' THEN
        UPDATE rx_nodes n SET process = p_process, watcher = p_watcher, vouched_until = NULL, died_at = NULL
         WHERE n.id = v_node.id
        RETURNING * INTO v_node;
    END IF;
    RETURN QUERY SELECT v_begun.outcome, v_begun.pipeline, v_begun.pipeline_epoch, v_begun.from_status, v_node;
END
$$;

-- A reserved request holds its room in the budget window from its reservation until its answer
-- (answered_at) plus the window: however long it took to reach the provider, the provider's
-- window around its arrival is covered. NULL while it is in flight.
ALTER TABLE rx_rate_reservations ADD COLUMN answered_at TIMESTAMPTZ;
