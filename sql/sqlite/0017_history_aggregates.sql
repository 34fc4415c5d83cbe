-- Figures kept as the work happens, so that what the metrics, `status` and the cost reports read costs
-- the same after a million finished pipelines as on the first day. Each aggregate is its own table, with
-- no foreign key: pruning the detail rows of old pipelines (items, ledger rows, the pipelines themselves)
-- leaves the figures of the work they did.

-- Times are epoch seconds and days 'YYYY-MM-DD' text, as everywhere in this folder.

-- Pipelines and queue items by their labels, with the sum and count of their durations (started to
-- completed, where both are finite times), kept by triggers on every insert, status change and delete.
CREATE TABLE rx_pipeline_counts (
    deployment TEXT NOT NULL,
    job_name TEXT NOT NULL,
    status TEXT NOT NULL,
    pipelines INTEGER NOT NULL DEFAULT 0,
    seconds_sum REAL NOT NULL DEFAULT 0,
    seconds_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (deployment, job_name, status)
);

CREATE TABLE rx_queue_counts (
    queue TEXT NOT NULL,
    status TEXT NOT NULL,
    items INTEGER NOT NULL DEFAULT 0,
    seconds_sum REAL NOT NULL DEFAULT 0,
    seconds_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, status)
);

-- Pipeline transitions that hand a pipeline to a new run, and give-ups, by event and cause ('' for none).
CREATE TABLE rx_resume_counts (
    event TEXT NOT NULL,
    cause TEXT NOT NULL,
    transitions INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (event, cause)
);

-- Item checkpoints of finished (completed or failed) pipelines by job and status, added when a pipeline
-- finishes and taken back if it is reopened; the checkpoints of live pipelines are counted where they are.
CREATE TABLE rx_finished_items (
    job_name TEXT NOT NULL,
    status TEXT NOT NULL,
    items INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_name, status)
);

-- The ledger of a finished pipeline, per node, model and outcome ('' for none), judged when it finished:
-- spent, saved by resume, wasted, replayed, in flight at a crash; skipped_rows counts its corrupt rows,
-- which no figure includes. day and job_name are the pipeline's (the UTC day it finished).
CREATE TABLE rx_ledger_pipeline_totals (
    pipeline_id INTEGER NOT NULL,
    node_name TEXT NOT NULL,
    model TEXT NOT NULL,
    outcome TEXT NOT NULL,
    job_name TEXT NOT NULL,
    day DATE NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost REAL NOT NULL DEFAULT 0,
    saved_calls INTEGER NOT NULL DEFAULT 0,
    saved_tokens INTEGER NOT NULL DEFAULT 0,
    saved_cost REAL NOT NULL DEFAULT 0,
    wasted_calls INTEGER NOT NULL DEFAULT 0,
    wasted_tokens INTEGER NOT NULL DEFAULT 0,
    wasted_cost REAL NOT NULL DEFAULT 0,
    replayed_calls INTEGER NOT NULL DEFAULT 0,
    in_flight_unknown_calls INTEGER NOT NULL DEFAULT 0,
    skipped_rows INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pipeline_id, node_name, model, outcome)
);

-- The same figures per day, job, model and outcome: what the metrics sum (a row per day, not per pipeline).
CREATE TABLE rx_ledger_daily (
    day DATE NOT NULL,
    job_name TEXT NOT NULL,
    model TEXT NOT NULL,
    outcome TEXT NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost REAL NOT NULL DEFAULT 0,
    saved_calls INTEGER NOT NULL DEFAULT 0,
    saved_tokens INTEGER NOT NULL DEFAULT 0,
    saved_cost REAL NOT NULL DEFAULT 0,
    wasted_calls INTEGER NOT NULL DEFAULT 0,
    wasted_tokens INTEGER NOT NULL DEFAULT 0,
    wasted_cost REAL NOT NULL DEFAULT 0,
    replayed_calls INTEGER NOT NULL DEFAULT 0,
    in_flight_unknown_calls INTEGER NOT NULL DEFAULT 0,
    skipped_rows INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, job_name, model, outcome)
);

CREATE TRIGGER rx_pipelines_inserted AFTER INSERT ON rx_pipelines FOR EACH ROW BEGIN
    INSERT INTO rx_pipeline_counts (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
    VALUES (NEW.deployment, NEW.job_name, NEW.status, 1, 1 * COALESCE((CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END), 0), CASE WHEN (CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END) IS NULL THEN 0 ELSE 1 END)
    ON CONFLICT (deployment, job_name, status) DO UPDATE SET pipelines = pipelines + excluded.pipelines,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
END;

CREATE TRIGGER rx_pipelines_deleted AFTER DELETE ON rx_pipelines FOR EACH ROW BEGIN
    INSERT INTO rx_pipeline_counts (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
    VALUES (OLD.deployment, OLD.job_name, OLD.status, -1, -1 * COALESCE((CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END), 0), CASE WHEN (CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END) IS NULL THEN 0 ELSE -1 END)
    ON CONFLICT (deployment, job_name, status) DO UPDATE SET pipelines = pipelines + excluded.pipelines,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
END;

CREATE TRIGGER rx_pipelines_relabeled AFTER UPDATE OF status, job_name, deployment, started_at, completed_at ON rx_pipelines FOR EACH ROW
    WHEN OLD.status IS NOT NEW.status OR OLD.job_name IS NOT NEW.job_name OR OLD.deployment IS NOT NEW.deployment OR OLD.started_at IS NOT NEW.started_at OR OLD.completed_at IS NOT NEW.completed_at
BEGIN
    INSERT INTO rx_pipeline_counts (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
    VALUES (OLD.deployment, OLD.job_name, OLD.status, -1, -1 * COALESCE((CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END), 0), CASE WHEN (CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END) IS NULL THEN 0 ELSE -1 END)
    ON CONFLICT (deployment, job_name, status) DO UPDATE SET pipelines = pipelines + excluded.pipelines,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
    INSERT INTO rx_pipeline_counts (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
    VALUES (NEW.deployment, NEW.job_name, NEW.status, 1, 1 * COALESCE((CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END), 0), CASE WHEN (CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END) IS NULL THEN 0 ELSE 1 END)
    ON CONFLICT (deployment, job_name, status) DO UPDATE SET pipelines = pipelines + excluded.pipelines,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
END;

CREATE TRIGGER rx_queue_items_inserted AFTER INSERT ON rx_queue_items FOR EACH ROW BEGIN
    INSERT INTO rx_queue_counts (queue, status, items, seconds_sum, seconds_count)
    VALUES (NEW.queue, NEW.status, 1, 1 * COALESCE((CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END), 0), CASE WHEN (CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END) IS NULL THEN 0 ELSE 1 END)
    ON CONFLICT (queue, status) DO UPDATE SET items = items + excluded.items,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
END;

CREATE TRIGGER rx_queue_items_deleted AFTER DELETE ON rx_queue_items FOR EACH ROW BEGIN
    INSERT INTO rx_queue_counts (queue, status, items, seconds_sum, seconds_count)
    VALUES (OLD.queue, OLD.status, -1, -1 * COALESCE((CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END), 0), CASE WHEN (CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END) IS NULL THEN 0 ELSE -1 END)
    ON CONFLICT (queue, status) DO UPDATE SET items = items + excluded.items,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
END;

CREATE TRIGGER rx_queue_items_relabeled AFTER UPDATE OF status, queue, started_at, completed_at ON rx_queue_items FOR EACH ROW
    WHEN OLD.status IS NOT NEW.status OR OLD.queue IS NOT NEW.queue OR OLD.started_at IS NOT NEW.started_at OR OLD.completed_at IS NOT NEW.completed_at
BEGIN
    INSERT INTO rx_queue_counts (queue, status, items, seconds_sum, seconds_count)
    VALUES (OLD.queue, OLD.status, -1, -1 * COALESCE((CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END), 0), CASE WHEN (CASE WHEN typeof(OLD.started_at) IN ('real', 'integer') AND typeof(OLD.completed_at) IN ('real', 'integer') THEN OLD.completed_at - OLD.started_at END) IS NULL THEN 0 ELSE -1 END)
    ON CONFLICT (queue, status) DO UPDATE SET items = items + excluded.items,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
    INSERT INTO rx_queue_counts (queue, status, items, seconds_sum, seconds_count)
    VALUES (NEW.queue, NEW.status, 1, 1 * COALESCE((CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END), 0), CASE WHEN (CASE WHEN typeof(NEW.started_at) IN ('real', 'integer') AND typeof(NEW.completed_at) IN ('real', 'integer') THEN NEW.completed_at - NEW.started_at END) IS NULL THEN 0 ELSE 1 END)
    ON CONFLICT (queue, status) DO UPDATE SET items = items + excluded.items,
        seconds_sum = seconds_sum + excluded.seconds_sum, seconds_count = seconds_count + excluded.seconds_count;
END;

CREATE TRIGGER rx_resume_recorded AFTER INSERT ON rx_transitions FOR EACH ROW
    WHEN NEW.entity_type = 'pipeline' AND NEW.event IN ('reclaimed', 'taken_over', 'reopened_for_degraded', 'given_up')
BEGIN
    INSERT INTO rx_resume_counts (event, cause, transitions)
    VALUES (NEW.event, COALESCE(CASE WHEN json_valid(NEW.data) AND json_type(NEW.data) = 'object'
                                     THEN json_extract(NEW.data, '$.cause') END, ''), 1)
    ON CONFLICT (event, cause) DO UPDATE SET transitions = transitions + 1;
END;

-- SQLite has no functions: a roll-up is asked for by inserting its range into this view (undo_job set:
-- take the figures of pipeline lo, of that job, back out), and the triggers below do it instead.
CREATE VIEW rx_roll_up_requests (lo, hi, undo_job) AS SELECT NULL, NULL, NULL WHERE 0;

-- The roll-up of the finished pipelines with ids lo..hi: their item checkpoints and their ledger, judged
-- as the cost report judges a pipeline that no longer runs (no call of it is open any more).
CREATE TRIGGER rx_roll_up_finished INSTEAD OF INSERT ON rx_roll_up_requests FOR EACH ROW WHEN NEW.undo_job IS NULL
BEGIN
    INSERT INTO rx_finished_items (job_name, status, items)
    SELECT p.job_name, i.status, count(*)
      FROM rx_pipelines p JOIN rx_node_items i ON i.pipeline_id = p.id
     WHERE p.id BETWEEN NEW.lo AND NEW.hi AND p.status IN ('completed', 'failed')
     GROUP BY p.job_name, i.status
    ON CONFLICT (job_name, status) DO UPDATE SET items = items + excluded.items;

    INSERT INTO rx_ledger_pipeline_totals
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
                   pc.outcome, p.job_name, date(COALESCE(p.completed_at, p.updated_at), 'unixepoch') AS day,
                   pc.tokens_in, pc.tokens_out, pc.tokens_in + pc.tokens_out AS tokens, COALESCE(pc.cost, 0) AS cost,
                   pc.replays, COALESCE(pc.reached_checkpoint AND pc.epoch < p.epoch, 0) AS saved,
                   NOT pc.reached_checkpoint AND pc.outcome <> 'in_flight' AS wasted,
                   -- the ledger's well-formed row (ledger_rows.py): bounded tokens, cost and latency
                   COALESCE(pc.tokens_in BETWEEN 0 AND 1099511627776 AND pc.tokens_out BETWEEN 0 AND 1099511627776
                            AND (pc.cost IS NULL OR pc.cost BETWEEN 0 AND 2199023255552)
                            AND pc.latency_seconds BETWEEN 0 AND 1000000000, 0) AS ok
              FROM rx_pipelines p JOIN rx_provider_calls pc ON pc.pipeline_id = p.id
             WHERE p.id BETWEEN NEW.lo AND NEW.hi AND p.status IN ('completed', 'failed')) AS c
     WHERE true
     GROUP BY c.pipeline_id, c.node_name, c.model, c.outcome
    ON CONFLICT (pipeline_id, node_name, model, outcome) DO NOTHING;

    INSERT INTO rx_ledger_daily
        (day, job_name, model, outcome, calls, tokens_in, tokens_out, cost, saved_calls, saved_tokens, saved_cost,
         wasted_calls, wasted_tokens, wasted_cost, replayed_calls, in_flight_unknown_calls, skipped_rows)
    SELECT day, job_name, model, outcome, sum(calls), sum(tokens_in), sum(tokens_out), sum(cost), sum(saved_calls),
           sum(saved_tokens), sum(saved_cost), sum(wasted_calls), sum(wasted_tokens), sum(wasted_cost),
           sum(replayed_calls), sum(in_flight_unknown_calls), sum(skipped_rows)
      FROM rx_ledger_pipeline_totals WHERE pipeline_id BETWEEN NEW.lo AND NEW.hi
     GROUP BY day, job_name, model, outcome
    ON CONFLICT (day, job_name, model, outcome) DO UPDATE
       SET calls = calls + excluded.calls, tokens_in = tokens_in + excluded.tokens_in,
           tokens_out = tokens_out + excluded.tokens_out, cost = cost + excluded.cost,
           saved_calls = saved_calls + excluded.saved_calls, saved_tokens = saved_tokens + excluded.saved_tokens,
           saved_cost = saved_cost + excluded.saved_cost, wasted_calls = wasted_calls + excluded.wasted_calls,
           wasted_tokens = wasted_tokens + excluded.wasted_tokens, wasted_cost = wasted_cost + excluded.wasted_cost,
           replayed_calls = replayed_calls + excluded.replayed_calls,
           in_flight_unknown_calls = in_flight_unknown_calls + excluded.in_flight_unknown_calls,
           skipped_rows = skipped_rows + excluded.skipped_rows;

END;

-- A finished pipeline reopened (to redo its degraded items): its figures leave the roll-up, and return,
-- judged again, when it finishes again.
CREATE TRIGGER rx_roll_back_finished INSTEAD OF INSERT ON rx_roll_up_requests FOR EACH ROW WHEN NEW.undo_job IS NOT NULL
BEGIN
    INSERT INTO rx_finished_items (job_name, status, items)
    SELECT NEW.undo_job, i.status, -count(*) FROM rx_node_items i WHERE i.pipeline_id = NEW.lo GROUP BY i.status
    ON CONFLICT (job_name, status) DO UPDATE SET items = items + excluded.items;

    INSERT INTO rx_ledger_daily
        (day, job_name, model, outcome, calls, tokens_in, tokens_out, cost, saved_calls, saved_tokens, saved_cost,
         wasted_calls, wasted_tokens, wasted_cost, replayed_calls, in_flight_unknown_calls, skipped_rows)
    SELECT day, job_name, model, outcome, -sum(calls), -sum(tokens_in), -sum(tokens_out), -sum(cost),
           -sum(saved_calls), -sum(saved_tokens), -sum(saved_cost), -sum(wasted_calls), -sum(wasted_tokens),
           -sum(wasted_cost), -sum(replayed_calls), -sum(in_flight_unknown_calls), -sum(skipped_rows)
      FROM rx_ledger_pipeline_totals WHERE pipeline_id = NEW.lo
     GROUP BY day, job_name, model, outcome
    ON CONFLICT (day, job_name, model, outcome) DO UPDATE
       SET calls = calls + excluded.calls, tokens_in = tokens_in + excluded.tokens_in,
           tokens_out = tokens_out + excluded.tokens_out, cost = cost + excluded.cost,
           saved_calls = saved_calls + excluded.saved_calls, saved_tokens = saved_tokens + excluded.saved_tokens,
           saved_cost = saved_cost + excluded.saved_cost, wasted_calls = wasted_calls + excluded.wasted_calls,
           wasted_tokens = wasted_tokens + excluded.wasted_tokens, wasted_cost = wasted_cost + excluded.wasted_cost,
           replayed_calls = replayed_calls + excluded.replayed_calls,
           in_flight_unknown_calls = in_flight_unknown_calls + excluded.in_flight_unknown_calls,
           skipped_rows = skipped_rows + excluded.skipped_rows;

    DELETE FROM rx_ledger_pipeline_totals WHERE pipeline_id = NEW.lo;
END;

CREATE TRIGGER rx_pipeline_finished AFTER UPDATE OF status ON rx_pipelines FOR EACH ROW
    WHEN (OLD.status IN ('completed', 'failed')) IS NOT (NEW.status IN ('completed', 'failed'))
BEGIN
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job)
    SELECT OLD.id, OLD.id, OLD.job_name WHERE OLD.status IN ('completed', 'failed');
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job)
    SELECT NEW.id, NEW.id, NULL WHERE NEW.status IN ('completed', 'failed');
END;

-- What is there already, counted once.
INSERT INTO rx_pipeline_counts (deployment, job_name, status, pipelines, seconds_sum, seconds_count)
SELECT deployment, job_name, status, count(*), COALESCE(sum(d), 0), count(d)
  FROM (SELECT deployment, job_name, status,
               CASE WHEN typeof(started_at) IN ('real', 'integer') AND typeof(completed_at) IN ('real', 'integer')
                    THEN completed_at - started_at END AS d FROM rx_pipelines)
 GROUP BY deployment, job_name, status;
INSERT INTO rx_queue_counts (queue, status, items, seconds_sum, seconds_count)
SELECT queue, status, count(*), COALESCE(sum(d), 0), count(d)
  FROM (SELECT queue, status,
               CASE WHEN typeof(started_at) IN ('real', 'integer') AND typeof(completed_at) IN ('real', 'integer')
                    THEN completed_at - started_at END AS d FROM rx_queue_items)
 GROUP BY queue, status;
INSERT INTO rx_resume_counts (event, cause, transitions)
SELECT event, COALESCE(CASE WHEN json_valid(data) AND json_type(data) = 'object'
                            THEN json_extract(data, '$.cause') END, ''), count(*)
  FROM rx_transitions
 WHERE entity_type = 'pipeline' AND event IN ('reclaimed', 'taken_over', 'reopened_for_degraded', 'given_up')
 GROUP BY 1, 2;
INSERT INTO rx_roll_up_requests (lo, hi) SELECT min(id), max(id) FROM rx_pipelines WHERE id IS NOT NULL HAVING count(*) > 0;

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
