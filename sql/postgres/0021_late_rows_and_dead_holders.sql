-- A ledger row that lands or changes after its pipeline finished is taken into the roll-ups (0017), which
-- judged the pipeline once, when it finished. A failed op's last paid call is written by the ledger's
-- thread up to half a second after the pipeline failed; a call in flight at the failure is completed when
-- its answer arrives. Such a statement judges its finished pipelines again: their figures leave the
-- roll-up and return judged with every row, as `costs` computes them from the detail. A prune's deletes
-- fire nothing: the figures of pruned work stay.
CREATE FUNCTION rx_judge_again(p_pipeline BIGINT, p_job TEXT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rx_roll_back_finished(p_pipeline, p_job);
    PERFORM rx_roll_up_finished(p_pipeline, p_pipeline);
END
$$;

-- The finished pipelines are locked in id order, so two late writers judge one pipeline one after the
-- other, and a take-over that reopens it (locking it first) is waited for and then seen running. NO KEY
-- UPDATE, the lock an UPDATE of the row takes: the KEY SHARE lock each writer's foreign key check already
-- holds on it does not conflict with it, so two writers never deadlock upgrading theirs.
CREATE FUNCTION rx_ledger_rows_landed_late() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rx_judge_again(finished.id, finished.job_name)
       FROM (SELECT p.id, p.job_name FROM rx_pipelines p
              WHERE p.id IN (SELECT pipeline_id FROM rx_new) AND p.status IN ('completed', 'failed')
              ORDER BY p.id FOR NO KEY UPDATE OF p) AS finished;
    RETURN NULL;
END
$$;

-- Once per statement (a checkpoint's ledger rows are one statement): a live pipeline's rows cost one lookup.
CREATE TRIGGER rx_ledger_rows_inserted_late AFTER INSERT ON rx_provider_calls REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_ledger_rows_landed_late();
CREATE TRIGGER rx_ledger_rows_updated_late AFTER UPDATE ON rx_provider_calls REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_ledger_rows_landed_late();

-- What landed late before this migration: finished pipelines with more ledger rows than their roll-up
-- judged, or with a call judged in flight (it may have been answered since), judged again.
SELECT rx_judge_again(p.id, p.job_name) FROM rx_pipelines p
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
ALTER TABLE rx_rate_reservations ADD COLUMN pipeline_id BIGINT, ADD COLUMN epoch INTEGER;
-- The trigger below and a prune (which detaches a pruned pipeline's reservations) find them by pipeline.
CREATE INDEX rx_rate_reservations_pipeline ON rx_rate_reservations (pipeline_id) WHERE pipeline_id IS NOT NULL;

CREATE FUNCTION rx_reservations_holder_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rx_rate_reservations SET answered_at = clock_timestamp()
     WHERE pipeline_id = NEW.id AND answered_at IS NULL
       AND (epoch IS DISTINCT FROM NEW.epoch OR NEW.status IN ('completed', 'failed', 'canceled'));
    RETURN NULL;
END
$$;

-- Row by row, and only when the epoch moves or the pipeline ends: heartbeats and progress never fire it.
CREATE TRIGGER rx_reservations_holder_gone AFTER UPDATE OF epoch, status ON rx_pipelines FOR EACH ROW
    WHEN (OLD.epoch IS DISTINCT FROM NEW.epoch
          OR (NEW.status IN ('completed', 'failed', 'canceled') AND OLD.status IS DISTINCT FROM NEW.status))
    EXECUTE FUNCTION rx_reservations_holder_gone();
