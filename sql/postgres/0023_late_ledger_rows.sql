-- A ledger row that lands or changes after its pipeline finished is taken into the roll-ups (0017), which
-- judged the pipeline once, when it finished. A failed op's last paid call is written by the ledger's
-- thread up to half a second after the pipeline failed; a call in flight at the failure is completed when
-- its answer arrives. Each such statement judges its finished pipelines again: their figures leave the
-- roll-up and return judged with every row, as `costs` computes them from the detail. A prune's deletes
-- fire nothing: the figures of pruned work stay.
CREATE FUNCTION rx_ledger_rows_landed_late() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_finished RECORD;
BEGIN
    -- Locked in id order, so two late writers judge one pipeline one after the other, and a take-over
    -- (which reopens it, and locks it first) is either waited for and then seen as running, or waits.
    FOR v_finished IN
        SELECT p.id, p.job_name FROM rx_pipelines p
         WHERE p.id IN (SELECT DISTINCT pipeline_id FROM rx_new WHERE pipeline_id IS NOT NULL)
           AND p.status IN ('completed', 'failed')
         ORDER BY p.id FOR UPDATE OF p
    LOOP
        PERFORM rx_roll_back_finished(v_finished.id, v_finished.job_name);
        PERFORM rx_roll_up_finished(v_finished.id, v_finished.id);
    END LOOP;
    RETURN NULL;
END
$$;

-- Once per statement (a checkpoint's ledger rows are one statement): a live pipeline's rows cost one lookup.
CREATE TRIGGER rx_ledger_rows_inserted_late AFTER INSERT ON rx_provider_calls REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_ledger_rows_landed_late();
CREATE TRIGGER rx_ledger_rows_updated_late AFTER UPDATE ON rx_provider_calls REFERENCING NEW TABLE AS rx_new
    FOR EACH STATEMENT EXECUTE FUNCTION rx_ledger_rows_landed_late();

-- Rows that landed late before this migration: every finished pipeline judged again, once.
DO $$
DECLARE
    v_finished RECORD;
BEGIN
    FOR v_finished IN SELECT id, job_name FROM rx_pipelines WHERE status IN ('completed', 'failed') ORDER BY id LOOP
        PERFORM rx_roll_back_finished(v_finished.id, v_finished.job_name);
    END LOOP;
    PERFORM rx_roll_up_finished(min(id), max(id)) FROM rx_pipelines;
END
$$;
