-- A ledger row that lands or changes after its pipeline finished is taken into the roll-ups (0017), which
-- judged the pipeline once, when it finished. A failed op's last paid call is written by the ledger's
-- thread up to half a second after the pipeline failed; a call in flight at the failure is completed when
-- its answer arrives. Such a row judges its finished pipeline again: its figures leave the roll-up and
-- return judged with every row, as `costs` computes them from the detail. A prune's deletes fire nothing:
-- the figures of pruned work stay.

-- Asked for by inserting a pipeline's id (SQLite has no functions; see rx_roll_up_requests): a finished
-- pipeline's figures are taken back, then rolled up again. Any other pipeline is left as it is.
CREATE VIEW rx_judge_again_requests (pipeline_id) AS SELECT NULL WHERE 0;

CREATE TRIGGER rx_judge_again INSTEAD OF INSERT ON rx_judge_again_requests FOR EACH ROW
BEGIN
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job)
    SELECT id, id, job_name FROM rx_pipelines WHERE id = NEW.pipeline_id AND status IN ('completed', 'failed');
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job) VALUES (NEW.pipeline_id, NEW.pipeline_id, NULL);
END;

CREATE TRIGGER rx_ledger_row_inserted_late AFTER INSERT ON rx_provider_calls FOR EACH ROW
    WHEN EXISTS (SELECT 1 FROM rx_pipelines WHERE id = NEW.pipeline_id AND status IN ('completed', 'failed'))
BEGIN
    INSERT INTO rx_judge_again_requests (pipeline_id) VALUES (NEW.pipeline_id);
END;

-- Only a change of what the roll-up judges: a replay's count, a checkpoint reached, a call completed.
CREATE TRIGGER rx_ledger_row_updated_late AFTER UPDATE OF pipeline_id, node_name, epoch, model, tokens_in, tokens_out,
    latency_seconds, outcome, cost, reached_checkpoint, replays ON rx_provider_calls FOR EACH ROW
    WHEN EXISTS (SELECT 1 FROM rx_pipelines WHERE id = NEW.pipeline_id AND status IN ('completed', 'failed'))
BEGIN
    INSERT INTO rx_judge_again_requests (pipeline_id) VALUES (NEW.pipeline_id);
END;

-- What landed late before this migration: finished pipelines with more ledger rows than their roll-up
-- judged, or with a call judged in flight (it may have been answered since), judged again.
INSERT INTO rx_judge_again_requests (pipeline_id)
SELECT p.id FROM rx_pipelines p
 WHERE p.status IN ('completed', 'failed')
   AND ((SELECT count(*) FROM rx_provider_calls c WHERE c.pipeline_id = p.id)
        <> (SELECT COALESCE(sum(t.calls + t.skipped_rows), 0) FROM rx_ledger_pipeline_totals t WHERE t.pipeline_id = p.id)
        OR EXISTS (SELECT 1 FROM rx_ledger_pipeline_totals t WHERE t.pipeline_id = p.id AND t.outcome = 'in_flight'))
 ORDER BY p.id;

-- A budget reservation (0013) knows its holder's pipeline and epoch. A reservation never answered counts
-- while its holder may still be waiting for the answer, however long, and stops being in flight when its
-- holder is superseded (a reclaim or a take-over moves the epoch on) or its pipeline ends: from then on it
-- holds its room as if answered at that moment, one window more, since the provider counted the request
-- before its holder died. A reservation made outside any pipeline keeps the old bound (five windows).
ALTER TABLE rx_rate_reservations ADD COLUMN pipeline_id INTEGER;
ALTER TABLE rx_rate_reservations ADD COLUMN epoch INTEGER;
-- The trigger below and a prune (which detaches a pruned pipeline's reservations) find them by pipeline.
CREATE INDEX rx_rate_reservations_pipeline ON rx_rate_reservations (pipeline_id) WHERE pipeline_id IS NOT NULL;

-- Row by row, and only when the epoch moves or the pipeline ends: heartbeats and progress never fire it.
CREATE TRIGGER rx_reservations_holder_gone AFTER UPDATE OF epoch, status ON rx_pipelines FOR EACH ROW
    WHEN OLD.epoch IS NOT NEW.epoch
         OR (NEW.status IN ('completed', 'failed', 'canceled') AND OLD.status IS NOT NEW.status)
BEGIN
    UPDATE rx_rate_reservations SET answered_at = (julianday('now') - 2440587.5) * 86400.0
     WHERE pipeline_id = NEW.id AND answered_at IS NULL
       AND (epoch IS NOT NEW.epoch OR NEW.status IN ('completed', 'failed', 'canceled'));
END;
