-- The ledger of provider work: one row per call to an LLM or OCR provider made by a node.
-- The id is made by the caller, so the row can be written at once, or later with the item's
-- checkpoint when the database was away, and never twice. reached_checkpoint is set in the
-- transaction that checkpoints the item the call answered (or completes its node), so a call
-- whose answer never reached a checkpoint (in flight at a crash, retried, made by a superseded
-- worker) stays false: that is what the reports count as wasted.

CREATE TABLE rx_provider_calls (
    id                  TEXT PRIMARY KEY,
    pipeline_id         BIGINT REFERENCES rx_pipelines(id) ON DELETE CASCADE,
    node_name           TEXT,
    item_key            TEXT,
    run_id              TEXT,
    epoch               INTEGER,
    endpoint            TEXT NOT NULL,
    model               TEXT,
    tokens_in           BIGINT NOT NULL DEFAULT 0,
    tokens_out          BIGINT NOT NULL DEFAULT 0,
    latency_seconds     DOUBLE PRECISION NOT NULL DEFAULT 0,
    outcome             TEXT NOT NULL,
    cost                DOUBLE PRECISION,
    reached_checkpoint  BOOLEAN NOT NULL DEFAULT false,
    recorded_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX rx_provider_calls_node ON rx_provider_calls (pipeline_id, node_name, item_key);
