-- Figures kept as the work happens, so that what the metrics, `status` and the cost reports read costs
-- the same after a million finished pipelines as on the first day. Each aggregate is its own table, with
-- no foreign key: pruning the detail rows of old pipelines (items, ledger rows, the pipelines themselves)
-- leaves the figures of the work they did.

-- Pipelines and queue items by their labels, with the sum and count of their durations (started to
-- completed, where both are finite times), kept by triggers on every insert, status change and delete.
CREATE TABLE rx_pipeline_counts (
    deployment TEXT NOT NULL,
    job_name TEXT NOT NULL,
    status TEXT NOT NULL,
    pipelines BIGINT NOT NULL DEFAULT 0,
    seconds_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    seconds_count BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (deployment, job_name, status)
);

CREATE TABLE rx_queue_counts (
    queue TEXT NOT NULL,
    status TEXT NOT NULL,
    items BIGINT NOT NULL DEFAULT 0,
    seconds_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    seconds_count BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, status)
);

-- Pipeline transitions that hand a pipeline to a new run, and give-ups, by event and cause ('' for none).
CREATE TABLE rx_resume_counts (
    event TEXT NOT NULL,
    cause TEXT NOT NULL,
    transitions BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (event, cause)
);

-- Item checkpoints of finished (completed or failed) pipelines by job and status, added when a pipeline
-- finishes and taken back if it is reopened; the checkpoints of live pipelines are counted where they are.
CREATE TABLE rx_finished_items (
    job_name TEXT NOT NULL,
    status TEXT NOT NULL,
    items BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (job_name, status)
);

-- The ledger of a finished pipeline, per node, model and outcome ('' for none), judged when it finished:
-- spent, saved by resume, wasted, replayed, in flight at a crash; skipped_rows counts its corrupt rows,
-- which no figure includes. day and job_name are the pipeline's (the UTC day it finished).
CREATE TABLE rx_ledger_pipeline_totals (
    pipeline_id BIGINT NOT NULL,
    node_name TEXT NOT NULL,
    model TEXT NOT NULL,
    outcome TEXT NOT NULL,
    job_name TEXT NOT NULL,
    day DATE NOT NULL,
    calls BIGINT NOT NULL DEFAULT 0,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    saved_calls BIGINT NOT NULL DEFAULT 0,
    saved_tokens BIGINT NOT NULL DEFAULT 0,
    saved_cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    wasted_calls BIGINT NOT NULL DEFAULT 0,
    wasted_tokens BIGINT NOT NULL DEFAULT 0,
    wasted_cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    replayed_calls BIGINT NOT NULL DEFAULT 0,
    in_flight_unknown_calls BIGINT NOT NULL DEFAULT 0,
    skipped_rows BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (pipeline_id, node_name, model, outcome)
);

-- The same figures per day, job, model and outcome: what the metrics sum (a row per day, not per pipeline).
CREATE TABLE rx_ledger_daily (
    day DATE NOT NULL,
    job_name TEXT NOT NULL,
    model TEXT NOT NULL,
    outcome TEXT NOT NULL,
    calls BIGINT NOT NULL DEFAULT 0,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    saved_calls BIGINT NOT NULL DEFAULT 0,
    saved_tokens BIGINT NOT NULL DEFAULT 0,
    saved_cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    wasted_calls BIGINT NOT NULL DEFAULT 0,
    wasted_tokens BIGINT NOT NULL DEFAULT 0,
    wasted_cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    replayed_calls BIGINT NOT NULL DEFAULT 0,
    in_flight_unknown_calls BIGINT NOT NULL DEFAULT 0,
    skipped_rows BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (day, job_name, model, outcome)
);

CREATE FUNCTION rx_duration(p_start TIMESTAMPTZ, p_end TIMESTAMPTZ) RETURNS DOUBLE PRECISION
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN isfinite(p_start) AND isfinite(p_end) THEN extract(epoch FROM p_end - p_start)::float8 END
$$;

-- Rows are added in key order, so two transactions never take the same counter rows in opposite orders.
CREATE FUNCTION rx_pipelines_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_pipeline_counts AS c (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
    SELECT deployment, job_name, status, sum(n), COALESCE(sum(n * d), 0), sum(CASE WHEN d IS NULL THEN 0 ELSE n END)
      FROM (SELECT deployment, job_name, status, 1 AS n, rx_duration(started_at, completed_at) AS d
              FROM rx_new) AS changed
     GROUP BY deployment, job_name, status ORDER BY deployment, job_name, status
    ON CONFLICT (deployment, job_name, status) DO UPDATE
       SET pipelines = c.pipelines + excluded.pipelines, seconds_sum = c.seconds_sum + excluded.seconds_sum,
           seconds_count = c.seconds_count + excluded.seconds_count;
    RETURN NULL;
END
$$;

CREATE FUNCTION rx_pipeline_recounted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_pipeline_counts AS c (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
    SELECT deployment, job_name, status, sum(n), COALESCE(sum(n * d), 0), sum(CASE WHEN d IS NULL THEN 0 ELSE n END)
      FROM (SELECT OLD.deployment, OLD.job_name, OLD.status, -1, rx_duration(OLD.started_at, OLD.completed_at)
            UNION ALL
            SELECT NEW.deployment, NEW.job_name, NEW.status, 1, rx_duration(NEW.started_at, NEW.completed_at)
             WHERE TG_OP = 'UPDATE') AS changed (deployment, job_name, status, n, d)
     GROUP BY deployment, job_name, status ORDER BY deployment, job_name, status
    ON CONFLICT (deployment, job_name, status) DO UPDATE
       SET pipelines = c.pipelines + excluded.pipelines, seconds_sum = c.seconds_sum + excluded.seconds_sum,
           seconds_count = c.seconds_count + excluded.seconds_count;
    RETURN NULL;
END
$$;

CREATE TRIGGER rx_pipelines_inserted AFTER INSERT ON rx_pipelines REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_pipelines_counted();
CREATE TRIGGER rx_pipeline_deleted AFTER DELETE ON rx_pipelines FOR EACH ROW
    EXECUTE FUNCTION rx_pipeline_recounted();
-- Row by row, and only when a counted column changes: heartbeats and progress never fire it.
CREATE TRIGGER rx_pipeline_relabeled AFTER UPDATE OF status, job_name, deployment, started_at, completed_at
    ON rx_pipelines FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.job_name IS DISTINCT FROM NEW.job_name
          OR OLD.deployment IS DISTINCT FROM NEW.deployment OR OLD.started_at IS DISTINCT FROM NEW.started_at
          OR OLD.completed_at IS DISTINCT FROM NEW.completed_at)
    EXECUTE FUNCTION rx_pipeline_recounted();

CREATE FUNCTION rx_queue_items_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_queue_counts AS c (queue, status, items, seconds_sum, seconds_count)
    SELECT queue, status, sum(n), COALESCE(sum(n * d), 0), sum(CASE WHEN d IS NULL THEN 0 ELSE n END)
      FROM (SELECT queue, status, 1 AS n, rx_duration(started_at, completed_at) AS d FROM rx_new) AS changed
     GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status) DO UPDATE
       SET items = c.items + excluded.items, seconds_sum = c.seconds_sum + excluded.seconds_sum,
           seconds_count = c.seconds_count + excluded.seconds_count;
    RETURN NULL;
END
$$;

CREATE FUNCTION rx_queue_item_recounted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_queue_counts AS c (queue, status, items, seconds_sum, seconds_count)
    SELECT queue, status, sum(n), COALESCE(sum(n * d), 0), sum(CASE WHEN d IS NULL THEN 0 ELSE n END)
      FROM (SELECT OLD.queue, OLD.status, -1, rx_duration(OLD.started_at, OLD.completed_at)
            UNION ALL
            SELECT NEW.queue, NEW.status, 1, rx_duration(NEW.started_at, NEW.completed_at)
             WHERE TG_OP = 'UPDATE') AS changed (queue, status, n, d)
     GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status) DO UPDATE
       SET items = c.items + excluded.items, seconds_sum = c.seconds_sum + excluded.seconds_sum,
           seconds_count = c.seconds_count + excluded.seconds_count;
    RETURN NULL;
END
$$;

CREATE TRIGGER rx_queue_items_inserted AFTER INSERT ON rx_queue_items REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_queue_items_counted();
CREATE TRIGGER rx_queue_item_deleted AFTER DELETE ON rx_queue_items FOR EACH ROW
    EXECUTE FUNCTION rx_queue_item_recounted();
CREATE TRIGGER rx_queue_item_relabeled AFTER UPDATE OF status, queue, started_at, completed_at
    ON rx_queue_items FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.queue IS DISTINCT FROM NEW.queue
          OR OLD.started_at IS DISTINCT FROM NEW.started_at OR OLD.completed_at IS DISTINCT FROM NEW.completed_at)
    EXECUTE FUNCTION rx_queue_item_recounted();

CREATE FUNCTION rx_resumes_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_resume_counts AS c (event, cause, transitions)
    SELECT event, COALESCE(CASE WHEN jsonb_typeof(data) = 'object' THEN data ->> 'cause' END, ''), count(*)
      FROM rx_new
     WHERE entity_type = 'pipeline' AND event IN ('reclaimed', 'taken_over', 'reopened_for_degraded', 'given_up')
     GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (event, cause) DO UPDATE SET transitions = c.transitions + excluded.transitions;
    RETURN NULL;
END
$$;

-- Once per statement: a mass reclaim's 10,000 transitions add to the counters in one upsert, not 10,000.
CREATE TRIGGER rx_resumes_recorded AFTER INSERT ON rx_transitions REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_resumes_counted();

-- The roll-up of the finished pipelines with ids p_lo..p_hi: their item checkpoints and their ledger,
-- judged as the cost report judges a pipeline that no longer runs (no call of it is open any more).
CREATE FUNCTION rx_roll_up_finished(p_lo BIGINT, p_hi BIGINT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_finished_items AS c (job_name, status, items)
    SELECT p.job_name, i.status, count(*)
      FROM rx_pipelines p JOIN rx_node_items i ON i.pipeline_id = p.id
     WHERE p.id BETWEEN p_lo AND p_hi AND p.status IN ('completed', 'failed')
     GROUP BY p.job_name, i.status ORDER BY p.job_name, i.status
    ON CONFLICT (job_name, status) DO UPDATE SET items = c.items + excluded.items;

    INSERT INTO rx_ledger_pipeline_totals AS t
        (pipeline_id, node_name, model, outcome, job_name, day, calls, tokens_in, tokens_out, cost, saved_calls,
         saved_tokens, saved_cost, wasted_calls, wasted_tokens, wasted_cost, replayed_calls,
         in_flight_unknown_calls, skipped_rows)
    SELECT c.pipeline_id, c.node_name, c.model, c.outcome, min(c.job_name), min(c.day),
           count(*) FILTER (WHERE c.ok), COALESCE(sum(c.tokens_in) FILTER (WHERE c.ok), 0),
           COALESCE(sum(c.tokens_out) FILTER (WHERE c.ok), 0), COALESCE(sum(c.cost) FILTER (WHERE c.ok), 0),
           count(*) FILTER (WHERE c.ok AND c.saved), COALESCE(sum(c.tokens) FILTER (WHERE c.ok AND c.saved), 0),
           COALESCE(sum(c.cost) FILTER (WHERE c.ok AND c.saved), 0),
           count(*) FILTER (WHERE c.ok AND c.wasted), COALESCE(sum(c.tokens) FILTER (WHERE c.ok AND c.wasted), 0),
           COALESCE(sum(c.cost) FILTER (WHERE c.ok AND c.wasted), 0),
           count(*) FILTER (WHERE c.ok AND c.saved AND c.replays > 0),
           count(*) FILTER (WHERE c.ok AND c.outcome = 'in_flight'), count(*) FILTER (WHERE NOT c.ok)
      FROM (SELECT pc.pipeline_id, COALESCE(pc.node_name, '') AS node_name, COALESCE(pc.model, '') AS model,
                   pc.outcome, p.job_name, (COALESCE(p.completed_at, p.updated_at) AT TIME ZONE 'UTC')::date AS day,
                   pc.tokens_in, pc.tokens_out, pc.tokens_in + pc.tokens_out AS tokens, COALESCE(pc.cost, 0) AS cost,
                   pc.replays,
                   COALESCE(pc.reached_checkpoint AND pc.epoch < p.epoch, false) AS saved,
                   NOT pc.reached_checkpoint AND pc.outcome <> 'in_flight' AS wasted,
                   -- the ledger's well-formed row (ledger_rows.py): bounded tokens, cost and latency
                   COALESCE(pc.tokens_in BETWEEN 0 AND 1099511627776 AND pc.tokens_out BETWEEN 0 AND 1099511627776
                            AND (pc.cost IS NULL OR pc.cost BETWEEN 0 AND 2199023255552)
                            AND pc.latency_seconds BETWEEN 0 AND 1000000000, false) AS ok
              FROM rx_pipelines p JOIN rx_provider_calls pc ON pc.pipeline_id = p.id
             WHERE p.id BETWEEN p_lo AND p_hi AND p.status IN ('completed', 'failed')) AS c
     GROUP BY c.pipeline_id, c.node_name, c.model, c.outcome
    ON CONFLICT (pipeline_id, node_name, model, outcome) DO NOTHING;

    INSERT INTO rx_ledger_daily AS d
        (day, job_name, model, outcome, calls, tokens_in, tokens_out, cost, saved_calls, saved_tokens, saved_cost,
         wasted_calls, wasted_tokens, wasted_cost, replayed_calls, in_flight_unknown_calls, skipped_rows)
    SELECT day, job_name, model, outcome, sum(calls), sum(tokens_in), sum(tokens_out), sum(cost), sum(saved_calls),
           sum(saved_tokens), sum(saved_cost), sum(wasted_calls), sum(wasted_tokens), sum(wasted_cost),
           sum(replayed_calls), sum(in_flight_unknown_calls), sum(skipped_rows)
      FROM rx_ledger_pipeline_totals WHERE pipeline_id BETWEEN p_lo AND p_hi
     GROUP BY day, job_name, model, outcome ORDER BY day, job_name, model, outcome
    ON CONFLICT (day, job_name, model, outcome) DO UPDATE
       SET calls = d.calls + excluded.calls, tokens_in = d.tokens_in + excluded.tokens_in,
           tokens_out = d.tokens_out + excluded.tokens_out, cost = d.cost + excluded.cost,
           saved_calls = d.saved_calls + excluded.saved_calls, saved_tokens = d.saved_tokens + excluded.saved_tokens,
           saved_cost = d.saved_cost + excluded.saved_cost, wasted_calls = d.wasted_calls + excluded.wasted_calls,
           wasted_tokens = d.wasted_tokens + excluded.wasted_tokens, wasted_cost = d.wasted_cost + excluded.wasted_cost,
           replayed_calls = d.replayed_calls + excluded.replayed_calls,
           in_flight_unknown_calls = d.in_flight_unknown_calls + excluded.in_flight_unknown_calls,
           skipped_rows = d.skipped_rows + excluded.skipped_rows;
END
$$;

-- A finished pipeline reopened (to redo its degraded items): its figures leave the roll-up, and return,
-- judged again, when it finishes again.
CREATE FUNCTION rx_roll_back_finished(p_pipeline BIGINT, p_job TEXT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rx_finished_items AS c (job_name, status, items)
    SELECT p_job, i.status, -count(*) FROM rx_node_items i WHERE i.pipeline_id = p_pipeline
     GROUP BY i.status ORDER BY i.status
    ON CONFLICT (job_name, status) DO UPDATE SET items = c.items + excluded.items;

    INSERT INTO rx_ledger_daily AS d
        (day, job_name, model, outcome, calls, tokens_in, tokens_out, cost, saved_calls, saved_tokens, saved_cost,
         wasted_calls, wasted_tokens, wasted_cost, replayed_calls, in_flight_unknown_calls, skipped_rows)
    SELECT day, job_name, model, outcome, -sum(calls), -sum(tokens_in), -sum(tokens_out), -sum(cost),
           -sum(saved_calls), -sum(saved_tokens), -sum(saved_cost), -sum(wasted_calls), -sum(wasted_tokens),
           -sum(wasted_cost), -sum(replayed_calls), -sum(in_flight_unknown_calls), -sum(skipped_rows)
      FROM rx_ledger_pipeline_totals WHERE pipeline_id = p_pipeline
     GROUP BY day, job_name, model, outcome ORDER BY day, job_name, model, outcome
    ON CONFLICT (day, job_name, model, outcome) DO UPDATE
       SET calls = d.calls + excluded.calls, tokens_in = d.tokens_in + excluded.tokens_in,
           tokens_out = d.tokens_out + excluded.tokens_out, cost = d.cost + excluded.cost,
           saved_calls = d.saved_calls + excluded.saved_calls, saved_tokens = d.saved_tokens + excluded.saved_tokens,
           saved_cost = d.saved_cost + excluded.saved_cost, wasted_calls = d.wasted_calls + excluded.wasted_calls,
           wasted_tokens = d.wasted_tokens + excluded.wasted_tokens, wasted_cost = d.wasted_cost + excluded.wasted_cost,
           replayed_calls = d.replayed_calls + excluded.replayed_calls,
           in_flight_unknown_calls = d.in_flight_unknown_calls + excluded.in_flight_unknown_calls,
           skipped_rows = d.skipped_rows + excluded.skipped_rows;
    DELETE FROM rx_ledger_pipeline_totals WHERE pipeline_id = p_pipeline;
END
$$;

CREATE FUNCTION rx_pipeline_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('completed', 'failed') THEN
        PERFORM rx_roll_back_finished(OLD.id, OLD.job_name);
    END IF;
    IF NEW.status IN ('completed', 'failed') THEN
        PERFORM rx_roll_up_finished(NEW.id, NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER rx_pipeline_finished AFTER UPDATE OF status ON rx_pipelines FOR EACH ROW
    WHEN ((OLD.status IN ('completed', 'failed')) IS DISTINCT FROM (NEW.status IN ('completed', 'failed')))
    EXECUTE FUNCTION rx_pipeline_finished();

-- What is there already, counted once.
INSERT INTO rx_pipeline_counts (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
SELECT deployment, job_name, status, count(*), COALESCE(sum(rx_duration(started_at, completed_at)), 0),
       count(rx_duration(started_at, completed_at))
  FROM rx_pipelines GROUP BY deployment, job_name, status;
INSERT INTO rx_queue_counts (queue, status, items, seconds_sum, seconds_count)
SELECT queue, status, count(*), COALESCE(sum(rx_duration(started_at, completed_at)), 0),
       count(rx_duration(started_at, completed_at))
  FROM rx_queue_items GROUP BY queue, status;
INSERT INTO rx_resume_counts (event, cause, transitions)
SELECT event, COALESCE(CASE WHEN jsonb_typeof(data) = 'object' THEN data ->> 'cause' END, ''), count(*)
  FROM rx_transitions
 WHERE entity_type = 'pipeline' AND event IN ('reclaimed', 'taken_over', 'reopened_for_degraded', 'given_up')
 GROUP BY 1, 2;
SELECT rx_roll_up_finished(min(id), max(id)) FROM rx_pipelines;

-- The live pipelines' detail, found without reading the history: ledger rows outside any pipeline, the
-- completed queue items a pipeline held (its report), queue items of a status this version does not know,
-- unfinished queue items.
CREATE INDEX rx_provider_calls_unowned ON rx_provider_calls (id) WHERE pipeline_id IS NULL;
CREATE INDEX rx_queue_holder_completed ON rx_queue_items (holder_pipeline_id, completed_at)
    WHERE status = 'completed';
CREATE INDEX rx_queue_unknown_status ON rx_queue_items (id)
    WHERE status NOT IN ('ready', 'processing', 'completed', 'failed', 'dead');
-- Unfinished queue items (the checks of `status` for rows no rule can move): a few, among every item ever.
CREATE INDEX rx_queue_unfinished ON rx_queue_items (id) WHERE status IN ('ready', 'processing');
