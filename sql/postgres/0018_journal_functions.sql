-- The call journal's two fenced writes as ONE round trip each: the journal may add at most
-- 2 % to a 200 ms provider call, and round trips were most of its cost. Each function runs the statements JournalOps' transaction ran, in the same
-- order: commit without waiting for the log flush (as commit_without_flush() did; see journal.py),
-- lock the pipeline row FOR KEY SHARE and check the owner's epoch and status (the fence), then the
-- writes. A PL/pgSQL statement takes a fresh snapshot in READ COMMITTED, so each write after the lock
-- sees what committed before it. A refused fence returns before anything is written, with what the
-- store needs to raise the same exception as its multi-statement path (SQLite). The store passes the
-- ledger row's values as ledger.call_row() made them (redacted, truncated) and the in-flight outcome,
-- so Python stays the one definition of both. The OUT columns are named unlike any table column, so
-- no reference inside the bodies is ambiguous.

-- The fence both writes begin with: no wait for the log flush, the pipeline row locked FOR KEY SHARE until
-- the commit, and the owner's epoch and status checked. 'fenced' lets the caller write; 'no_pipeline' and
-- 'lost' come with the pipeline's owner, epoch and status as found.
CREATE FUNCTION rx_journal_fence(p_pipeline BIGINT, p_epoch INTEGER)
RETURNS TABLE (verdict TEXT, pipeline_owner TEXT, pipeline_epoch INTEGER, pipeline_status TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch INTEGER;
    v_owner TEXT;
    v_status TEXT;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT p.epoch, p.owner, p.status INTO v_epoch, v_owner, v_status FROM rx_pipelines p
     WHERE p.id = p_pipeline FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_pipeline'::TEXT, NULL::TEXT, NULL::INTEGER, NULL::TEXT;
    ELSIF v_epoch <> p_epoch OR v_status <> 'running' THEN
        RETURN QUERY SELECT 'lost'::TEXT, v_owner, v_epoch, v_status;
    ELSE
        RETURN QUERY SELECT 'fenced'::TEXT, v_owner, v_epoch, v_status;
    END IF;
END
$$;

CREATE FUNCTION rx_journal_begin(p_pipeline BIGINT, p_epoch INTEGER, p_node TEXT, p_item TEXT, p_call_key TEXT,
                                 p_id TEXT, p_call_pipeline BIGINT, p_call_node TEXT, p_call_item TEXT,
                                 p_run_id TEXT, p_call_epoch INTEGER, p_endpoint TEXT, p_model TEXT,
                                 p_tokens_in BIGINT, p_tokens_out BIGINT, p_latency DOUBLE PRECISION,
                                 p_outcome TEXT, p_cost DOUBLE PRECISION, p_reached BOOLEAN, p_note TEXT)
RETURNS TABLE (verdict TEXT, pipeline_owner TEXT, pipeline_epoch INTEGER, pipeline_status TEXT,
               journaled_answer TEXT, paid_call rx_provider_calls)
LANGUAGE plpgsql AS $$
DECLARE
    v_fence RECORD;
    v_answer TEXT;
    v_call_id TEXT;
    v_call rx_provider_calls;
BEGIN
    SELECT * INTO v_fence FROM rx_journal_fence(p_pipeline, p_epoch);
    IF v_fence.verdict <> 'fenced' THEN
        RETURN QUERY SELECT v_fence.verdict, v_fence.pipeline_owner, v_fence.pipeline_epoch, v_fence.pipeline_status,
                            NULL::TEXT, NULL::rx_provider_calls;
        RETURN;
    END IF;
    IF p_call_key IS NOT NULL THEN
        SELECT j.answer, j.call_id INTO v_answer, v_call_id FROM rx_call_journal j
         WHERE j.pipeline_id = p_pipeline AND j.node_name = p_node AND j.item_key = p_item
           AND j.call_key = p_call_key;
        IF FOUND THEN
            -- the answer is handed back: its paid call counts one more replay, no new ledger row
            UPDATE rx_provider_calls c SET replays = c.replays + 1 WHERE c.id = v_call_id RETURNING * INTO v_call;
            IF FOUND THEN
                RETURN QUERY SELECT 'hit'::TEXT, v_fence.pipeline_owner, v_fence.pipeline_epoch, v_fence.pipeline_status,
                                    v_answer, v_call;
                RETURN;
            END IF;
        END IF;
    END IF;
    INSERT INTO rx_provider_calls (id, pipeline_id, node_name, item_key, run_id, epoch, endpoint, model, tokens_in,
                                   tokens_out, latency_seconds, outcome, cost, reached_checkpoint, note, recorded_at)
    VALUES (p_id, p_call_pipeline, p_call_node, p_call_item, p_run_id, p_call_epoch, p_endpoint, p_model, p_tokens_in,
            p_tokens_out, p_latency, p_outcome, p_cost, p_reached, p_note, now())
    ON CONFLICT (id) DO NOTHING;
    RETURN QUERY SELECT 'written'::TEXT, v_fence.pipeline_owner, v_fence.pipeline_epoch, v_fence.pipeline_status,
                        NULL::TEXT, NULL::rx_provider_calls;
END
$$;

CREATE FUNCTION rx_journal_answer(p_pipeline BIGINT, p_epoch INTEGER, p_node TEXT, p_item TEXT, p_call_key TEXT,
                                  p_call_id TEXT, p_answer TEXT, p_in_flight TEXT, p_model TEXT,
                                  p_tokens_in BIGINT, p_tokens_out BIGINT, p_latency DOUBLE PRECISION,
                                  p_outcome TEXT, p_cost DOUBLE PRECISION, p_note TEXT)
RETURNS TABLE (verdict TEXT, pipeline_owner TEXT, pipeline_epoch INTEGER, pipeline_status TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    v_fence RECORD;
BEGIN
    SELECT * INTO v_fence FROM rx_journal_fence(p_pipeline, p_epoch);
    IF v_fence.verdict <> 'fenced' THEN
        RETURN QUERY SELECT v_fence.verdict, v_fence.pipeline_owner, v_fence.pipeline_epoch, v_fence.pipeline_status;
        RETURN;
    END IF;
    IF p_call_key IS NOT NULL AND p_answer IS NOT NULL THEN
        -- fresh=True: the new answer replaces the old
        INSERT INTO rx_call_journal AS j (pipeline_id, node_name, item_key, call_key, call_id, epoch, answer,
                                          answered_at)
        VALUES (p_pipeline, p_node, p_item, p_call_key, p_call_id, p_epoch, p_answer, now())
        ON CONFLICT (pipeline_id, node_name, item_key, call_key) DO UPDATE
           SET call_id = EXCLUDED.call_id, epoch = EXCLUDED.epoch, answer = EXCLUDED.answer,
               answered_at = EXCLUDED.answered_at;
    END IF;
    UPDATE rx_provider_calls c
       SET model = p_model, tokens_in = p_tokens_in, tokens_out = p_tokens_out, latency_seconds = p_latency,
           outcome = p_outcome, cost = p_cost, note = p_note
     WHERE c.id = p_call_id AND c.outcome = p_in_flight;
    RETURN QUERY SELECT 'written'::TEXT, v_fence.pipeline_owner, v_fence.pipeline_epoch, v_fence.pipeline_status;
END
$$;
