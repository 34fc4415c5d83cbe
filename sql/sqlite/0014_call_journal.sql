-- The call journal: the answer of every journaled provider call, kept (fenced by the owner's epoch)
-- before the caller's code sees it, so a resume that makes the same call for an unfinished item gets
-- that answer back instead of paying for it again. call_key is a fingerprint of the request (or an
-- explicit idempotency key) and its occurrence within the item; item_key is '' for a call made
-- outside any item. call_id is the ledger row of the call that paid for the answer.
-- Entries go when their pipeline completes or is canceled (the trigger, in the same transaction);
-- a failed pipeline keeps them, since a redo may still use them. The ledger rows stay.

CREATE TABLE rx_call_journal (
    pipeline_id  INTEGER NOT NULL REFERENCES rx_pipelines(id) ON DELETE CASCADE,
    node_name    TEXT NOT NULL,
    item_key     TEXT NOT NULL DEFAULT '',
    call_key     TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    epoch        INTEGER NOT NULL,
    answer       TEXT NOT NULL,
    answered_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (pipeline_id, node_name, item_key, call_key)
);

-- How many times the call's journaled answer was handed to a later attempt instead of a new call.
ALTER TABLE rx_provider_calls ADD COLUMN replays INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER rx_call_journal_pipeline_ended
    AFTER UPDATE OF status ON rx_pipelines
    FOR EACH ROW WHEN NEW.status IN ('completed', 'canceled') AND OLD.status IS NOT NEW.status
    -- one line: the migration runner splits statements at a line's final semicolon
    BEGIN DELETE FROM rx_call_journal WHERE pipeline_id = NEW.id; END;

-- Asynchronous provider jobs (a batch of LLM requests, an OCR job): one row per submission, written with
-- its idempotency token before the job is submitted, the provider's job id recorded as soon as it is
-- known. A resume finds the job here and re-attaches to it by id (or, with no id yet, by its token at
-- the provider) instead of submitting again. items: the JSON list of the item keys the job holds.
-- status: submitting, submitted, then collected (its results were taken) or expired, cancelled, failed.
CREATE TABLE rx_provider_jobs (
    pipeline_id   INTEGER NOT NULL REFERENCES rx_pipelines(id) ON DELETE CASCADE,
    node_name     TEXT NOT NULL,
    token         TEXT NOT NULL,
    provider      TEXT NOT NULL,
    job_id        TEXT,
    status        TEXT NOT NULL,
    items         TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    call_id       TEXT NOT NULL,
    created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    updated_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (pipeline_id, node_name, token)
);
