-- A ledger row that lands or changes after its pipeline finished is taken into the roll-ups (0017), which
-- judged the pipeline once, when it finished. A failed op's last paid call is written by the ledger's
-- thread up to half a second after the pipeline failed; a call in flight at the failure is completed when
-- its answer arrives. Each such row judges its finished pipeline again: its figures leave the roll-up and
-- return judged with every row, as `costs` computes them from the detail. A prune's deletes fire nothing:
-- the figures of pruned work stay.
CREATE TRIGGER rx_ledger_row_inserted_late AFTER INSERT ON rx_provider_calls FOR EACH ROW
    WHEN NEW.pipeline_id IS NOT NULL
         AND EXISTS (SELECT 1 FROM rx_pipelines WHERE id = NEW.pipeline_id AND status IN ('completed', 'failed'))
BEGIN
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job)
    SELECT id, id, job_name FROM rx_pipelines WHERE id = NEW.pipeline_id;
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job) VALUES (NEW.pipeline_id, NEW.pipeline_id, NULL);
END;

-- Only a change of what the roll-up judges: a replay's count, a checkpoint reached, a call completed.
CREATE TRIGGER rx_ledger_row_updated_late AFTER UPDATE OF pipeline_id, node_name, epoch, model, tokens_in, tokens_out,
    latency_seconds, outcome, cost, reached_checkpoint, replays ON rx_provider_calls FOR EACH ROW
    WHEN NEW.pipeline_id IS NOT NULL
         AND EXISTS (SELECT 1 FROM rx_pipelines WHERE id = NEW.pipeline_id AND status IN ('completed', 'failed'))
BEGIN
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job)
    SELECT id, id, job_name FROM rx_pipelines WHERE id = NEW.pipeline_id;
    INSERT INTO rx_roll_up_requests (lo, hi, undo_job) VALUES (NEW.pipeline_id, NEW.pipeline_id, NULL);
END;

-- Rows that landed late before this migration: every finished pipeline judged again, once.
INSERT INTO rx_roll_up_requests (lo, hi, undo_job)
SELECT id, id, job_name FROM rx_pipelines WHERE status IN ('completed', 'failed');
INSERT INTO rx_roll_up_requests (lo, hi) SELECT min(id), max(id) FROM rx_pipelines WHERE id IS NOT NULL HAVING count(*) > 0;
