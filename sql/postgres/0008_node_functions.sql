-- A node's start and its completion as ONE round trip each (issue 11: cost when nothing fails).
-- Each function runs the same statements the multi-statement transaction ran, in the same
-- order: lock the pipeline row FOR NO KEY UPDATE first, then read and move the node, record
-- the transition, refresh the pipeline. A PL/pgSQL statement takes a fresh snapshot in READ
-- COMMITTED, so everything after the lock sees what siblings committed before it: no stale
-- counts and no lock upgrade (a single SQL statement that locks, then updates the same row,
-- would work from a snapshot taken before its lock wait). The store passes the legal source
-- statuses (pipeline_store.NODE_TRANSITIONS stays the one definition) and whether this call
-- is a retry whose first attempt may have committed; it turns each outcome into its exception.

CREATE FUNCTION rx_begin_node(p_run_id TEXT, p_name TEXT, p_sources TEXT[], p_heartbeat_timeout DOUBLE PRECISION,
                              p_stall_timeout DOUBLE PRECISION, p_retry BOOLEAN)
RETURNS TABLE (outcome TEXT, pipeline BIGINT, pipeline_epoch INTEGER, from_status TEXT, node rx_nodes)
LANGUAGE plpgsql AS $$
DECLARE
    v_pipeline BIGINT;
    v_epoch INTEGER;
    v_node rx_nodes;
    v_before TEXT;
BEGIN
    SELECT p.id, p.epoch INTO v_pipeline, v_epoch FROM rx_pipelines p
     WHERE p.owner = p_run_id AND p.status = 'running' ORDER BY p.id LIMIT 1 FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_pipeline'::TEXT, NULL::BIGINT, NULL::INTEGER, NULL::TEXT, NULL::rx_nodes;
        RETURN;
    END IF;
    SELECT * INTO v_node FROM rx_nodes n WHERE n.pipeline_id = v_pipeline AND n.name = p_name;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_node'::TEXT, v_pipeline, v_epoch, NULL::TEXT, NULL::rx_nodes;
        RETURN;
    END IF;
    v_before := v_node.status;
    IF v_before IN ('completed', 'degraded', 'skipped') THEN
        RETURN QUERY SELECT 'finished'::TEXT, v_pipeline, v_epoch, v_before, v_node;
        RETURN;
    END IF;
    IF p_retry AND v_before = 'running' AND v_node.run_id = p_run_id THEN
        RETURN QUERY SELECT 'started'::TEXT, v_pipeline, v_epoch, v_before, v_node;  -- the first attempt committed
        RETURN;
    END IF;
    IF NOT (v_before = ANY (p_sources)) THEN
        RETURN QUERY SELECT 'illegal'::TEXT, v_pipeline, v_epoch, v_before, v_node;
        RETURN;
    END IF;
    UPDATE rx_nodes n
       SET status = 'running', updated_at = now(), attempts = n.attempts + 1, run_id = p_run_id,
           started_at = now(), completed_at = NULL, heartbeat_at = now(),
           heartbeat_deadline = now() + make_interval(secs => p_heartbeat_timeout),
           stall_deadline = CASE WHEN p_stall_timeout > 0 THEN now() + make_interval(secs => p_stall_timeout) END
     WHERE n.id = v_node.id AND n.status = v_before
    RETURNING * INTO v_node;
    INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
    VALUES ('node', v_node.id, v_pipeline, v_before, 'running', 'started',
            jsonb_build_object('epoch', v_epoch, 'owner', p_run_id), now());
    UPDATE rx_pipelines p
       SET updated_at = now(), heartbeat_at = now(), current_node = p_name,
           heartbeat_deadline = now() + make_interval(secs => p_heartbeat_timeout)
     WHERE p.id = v_pipeline AND p.epoch = v_epoch;
    RETURN QUERY SELECT 'started'::TEXT, v_pipeline, v_epoch, v_before, v_node;
END
$$;

CREATE FUNCTION rx_complete_node(p_pipeline BIGINT, p_epoch INTEGER, p_owner TEXT, p_name TEXT, p_output JSONB,
                                 p_sources TEXT[], p_item_statuses TEXT[], p_heartbeat_timeout DOUBLE PRECISION,
                                 p_retry BOOLEAN)
RETURNS TABLE (outcome TEXT, status TEXT, owner TEXT, epoch INTEGER, unfinished INTEGER, total INTEGER)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch INTEGER;
    v_owner TEXT;
    v_status TEXT;
    v_node rx_nodes;
    v_finished INTEGER;
    v_left INTEGER;
BEGIN
    SELECT p.epoch, p.owner, p.status INTO v_epoch, v_owner, v_status FROM rx_pipelines p
     WHERE p.id = p_pipeline FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_pipeline'::TEXT, NULL::TEXT, NULL::TEXT, NULL::INTEGER, NULL::INTEGER, NULL::INTEGER;
        RETURN;
    END IF;
    IF p_retry AND v_epoch = p_epoch AND v_owner = p_owner AND v_status IN ('completed', 'failed') THEN
        RETURN QUERY SELECT 'pipeline_finished'::TEXT, v_status, v_owner, v_epoch, NULL::INTEGER, NULL::INTEGER;
        RETURN;
    END IF;
    IF v_epoch <> p_epoch OR v_status <> 'running' THEN
        RETURN QUERY SELECT 'lost'::TEXT, v_status, v_owner, v_epoch, NULL::INTEGER, NULL::INTEGER;
        RETURN;
    END IF;
    SELECT * INTO v_node FROM rx_nodes n WHERE n.pipeline_id = p_pipeline AND n.name = p_name;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_node'::TEXT, NULL::TEXT, NULL::TEXT, NULL::INTEGER, NULL::INTEGER, NULL::INTEGER;
        RETURN;
    END IF;
    IF COALESCE(v_node.items_total, 0) > 0 THEN
        SELECT count(*) INTO v_finished FROM rx_node_items i
         WHERE i.pipeline_id = p_pipeline AND i.node_name = p_name AND i.status = ANY (p_item_statuses);
        IF v_finished < v_node.items_total THEN
            RETURN QUERY SELECT 'unfinished'::TEXT, NULL::TEXT, NULL::TEXT, NULL::INTEGER,
                                v_node.items_total - v_finished, v_node.items_total;
            RETURN;
        END IF;
    END IF;
    IF NOT (p_retry AND v_node.status = 'completed' AND v_node.run_id = p_owner) THEN
        IF NOT (v_node.status = ANY (p_sources)) THEN
            RETURN QUERY SELECT 'illegal'::TEXT, v_node.status, NULL::TEXT, NULL::INTEGER, NULL::INTEGER, NULL::INTEGER;
            RETURN;
        END IF;
        UPDATE rx_nodes n
           SET status = 'completed', updated_at = now(), output = p_output, completed_at = now(), error = NULL,
               error_category = NULL, error_status_code = NULL, stall_deadline = NULL, run_id = p_owner
         WHERE n.id = v_node.id AND n.status = v_node.status;
        INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
        VALUES ('node', v_node.id, p_pipeline, v_node.status, 'completed', 'completed',
                jsonb_build_object('epoch', p_epoch, 'owner', p_owner), now());
    END IF;
    UPDATE rx_pipelines p
       SET updated_at = now(),
           heartbeat_at = CASE WHEN p_heartbeat_timeout IS NULL THEN p.heartbeat_at ELSE now() END,
           heartbeat_deadline = CASE WHEN p_heartbeat_timeout IS NULL THEN p.heartbeat_deadline
                                     ELSE now() + make_interval(secs => p_heartbeat_timeout) END
     WHERE p.id = p_pipeline AND p.epoch = p_epoch;
    SELECT count(*) INTO v_left FROM rx_nodes n
     WHERE n.pipeline_id = p_pipeline AND n.status NOT IN ('completed', 'degraded', 'skipped');
    IF v_left > 0 THEN
        RETURN QUERY SELECT 'completed'::TEXT, NULL::TEXT, NULL::TEXT, NULL::INTEGER, NULL::INTEGER, NULL::INTEGER;
        RETURN;
    END IF;
    UPDATE rx_pipelines p
       SET status = 'completed', completed_at = now(), updated_at = now(), current_node = NULL,
           heartbeat_deadline = NULL, error = NULL, gave_up_reason = NULL, waiting_until = NULL,
           waiting_since = NULL, waiting_reason = NULL
     WHERE p.id = p_pipeline AND p.epoch = p_epoch AND p.status = 'running';
    INSERT INTO rx_transitions (entity_type, entity_id, pipeline_id, from_status, to_status, event, data, at)
    VALUES ('pipeline', p_pipeline, p_pipeline, 'running', 'completed', 'completed',
            jsonb_build_object('epoch', p_epoch, 'owner', p_owner), now());
    RETURN QUERY SELECT 'pipeline_completed'::TEXT, NULL::TEXT, NULL::TEXT, NULL::INTEGER, NULL::INTEGER, NULL::INTEGER;
END
$$;
