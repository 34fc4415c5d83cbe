-- "Saved by resume", defined once, here: the paid calls a resume did not make again because their answers
-- reached a checkpoint (an item's, a node's, or a journaled answer the resume replayed into one) before
-- the pipeline was taken over, in a node a later run went through again. Such a call was made under an
-- earlier ownership epoch than the pipeline's, and its node's run_id (set by every start and every
-- completion of the node) is no longer the run that made it: a later run re-entered that node and skipped
-- or replayed the call's item instead of asking the provider again. A node that finished before the crash
-- is skipped whole by the resume, never started: its run_id stays its own run's, and its calls were never
-- at risk, so they are kept by their run, not saved. The cost report (ledger.py), a run's call fates
-- (observability.py) and the roll-ups of finished pipelines (0017, below) all read this view.
-- A run that takes over its own pipeline again under a new epoch (its run_id unchanged) saves nothing by
-- this rule; every resume path hands the pipeline to a new run.
-- One table in its FROM, the rest in EXISTS: a reader's LEFT JOIN of it on call_id is then flattened into a
-- look-up by primary key (SQLite materializes a view with a join on the right of a LEFT JOIN: every call).
CREATE VIEW rx_calls_saved_by_resume (call_id) AS
SELECT pc.id
  FROM rx_provider_calls pc
 WHERE pc.reached_checkpoint
   AND EXISTS (SELECT 1 FROM rx_pipelines p JOIN rx_nodes n ON n.pipeline_id = p.id
                WHERE p.id = pc.pipeline_id AND pc.epoch < p.epoch
                  AND n.name = pc.node_name AND n.run_id <> pc.run_id);

DROP TRIGGER rx_roll_up_finished;

-- The roll-up of 0017, its saved figure now read from rx_calls_saved_by_resume (nothing else changes).
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
                   pc.replays, s.call_id IS NOT NULL AS saved,
                   NOT pc.reached_checkpoint AND pc.outcome <> 'in_flight' AS wasted,
                   -- the ledger's well-formed row (ledger_rows.py): bounded tokens, cost and latency
                   COALESCE(pc.tokens_in BETWEEN 0 AND 1099511627776 AND pc.tokens_out BETWEEN 0 AND 1099511627776
                            AND (pc.cost IS NULL OR pc.cost BETWEEN 0 AND 2199023255552)
                            AND pc.latency_seconds BETWEEN 0 AND 1000000000, 0) AS ok
              FROM rx_pipelines p JOIN rx_provider_calls pc ON pc.pipeline_id = p.id
                   LEFT JOIN rx_calls_saved_by_resume s ON s.call_id = pc.id
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

-- The finished pipelines the old rule (any checkpointed call of an earlier epoch) found savings in, judged
-- again by this one. A pruned pipeline's figures stay as they were judged: its detail is gone.
INSERT INTO rx_judge_again_requests (pipeline_id)
SELECT p.id FROM rx_pipelines p
 WHERE p.status IN ('completed', 'failed')
   AND EXISTS (SELECT 1 FROM rx_ledger_pipeline_totals t WHERE t.pipeline_id = p.id AND t.saved_calls <> 0)
 ORDER BY p.id;
