-- recovery-ext schema, PostgreSQL. Applied by `recovery-ext migrate`; recorded in rx_schema_migrations.
-- Every live-row scan has a partial index over live rows only, so a million finished
-- pipelines cost the recovery scan nothing.

CREATE TABLE rx_pipelines (
    id                  BIGSERIAL PRIMARY KEY,
    job_name            TEXT NOT NULL,
    origin_run_id       TEXT UNIQUE,
    params              JSONB NOT NULL DEFAULT '{}'::jsonb,
    status              TEXT NOT NULL DEFAULT 'pending',
    current_node        TEXT,
    owner               TEXT,
    resumed_from        TEXT,
    epoch               INTEGER NOT NULL DEFAULT 0,
    heartbeat_at        TIMESTAMPTZ,
    heartbeat_deadline  TIMESTAMPTZ,
    deadline            TIMESTAMPTZ,
    resume_count        INTEGER NOT NULL DEFAULT 0,
    max_resumes         INTEGER NOT NULL DEFAULT 3,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at          TIMESTAMPTZ,
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at        TIMESTAMPTZ,
    error               TEXT,
    gave_up_reason      TEXT
);
CREATE INDEX rx_pipelines_live ON rx_pipelines (heartbeat_deadline, id)
    WHERE status NOT IN ('completed', 'failed');
CREATE INDEX rx_pipelines_live_deadline ON rx_pipelines (deadline)
    WHERE status NOT IN ('completed', 'failed') AND deadline IS NOT NULL;
CREATE INDEX rx_pipelines_finished ON rx_pipelines (status, completed_at)
    WHERE status IN ('completed', 'failed');

CREATE TABLE rx_nodes (
    id                  BIGSERIAL PRIMARY KEY,
    pipeline_id         BIGINT NOT NULL REFERENCES rx_pipelines (id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    position            INTEGER NOT NULL,
    status              TEXT NOT NULL DEFAULT 'pending',
    optional            BOOLEAN NOT NULL DEFAULT FALSE,
    attempts            INTEGER NOT NULL DEFAULT 0,
    items_total         INTEGER,
    error               TEXT,
    error_category      TEXT,
    error_status_code   INTEGER,
    run_id              TEXT,
    started_at          TIMESTAMPTZ,
    completed_at        TIMESTAMPTZ,
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at        TIMESTAMPTZ,
    heartbeat_deadline  TIMESTAMPTZ,
    stall_deadline      TIMESTAMPTZ,
    output              JSONB,
    CONSTRAINT rx_nodes_pipeline_name UNIQUE (pipeline_id, name)
);
CREATE INDEX rx_nodes_running ON rx_nodes (pipeline_id) WHERE status = 'running';
CREATE INDEX rx_nodes_stalled ON rx_nodes (stall_deadline)
    WHERE status = 'running' AND stall_deadline IS NOT NULL;

CREATE TABLE rx_node_items (
    pipeline_id         BIGINT NOT NULL REFERENCES rx_pipelines (id) ON DELETE CASCADE,
    node_name           TEXT NOT NULL,
    item_key            TEXT NOT NULL,
    status              TEXT NOT NULL DEFAULT 'completed',
    result              JSONB,
    run_id              TEXT,
    epoch               INTEGER,
    completed_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline_id, node_name, item_key)
);

CREATE TABLE rx_queue_items (
    id                  BIGSERIAL PRIMARY KEY,
    queue               TEXT NOT NULL,
    dedupe_key          TEXT,
    payload             JSONB NOT NULL DEFAULT '{}'::jsonb,
    status              TEXT NOT NULL DEFAULT 'ready',
    worker              TEXT,
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL DEFAULT 3,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at          TIMESTAMPTZ,
    heartbeat_deadline  TIMESTAMPTZ,
    completed_at        TIMESTAMPTZ,
    result              JSONB,
    last_error          TEXT,
    last_error_at       TIMESTAMPTZ,
    CONSTRAINT rx_queue_items_dedupe UNIQUE (queue, dedupe_key)
);
CREATE INDEX rx_queue_ready ON rx_queue_items (queue, id) WHERE status = 'ready';
CREATE INDEX rx_queue_processing ON rx_queue_items (queue, started_at) WHERE status = 'processing';
CREATE INDEX rx_queue_dead ON rx_queue_items (queue, id) WHERE status = 'dead';

CREATE TABLE rx_transitions (
    id                  BIGSERIAL PRIMARY KEY,
    entity_type         TEXT NOT NULL,
    entity_id           BIGINT NOT NULL,
    pipeline_id         BIGINT,
    from_status         TEXT,
    to_status           TEXT NOT NULL,
    event               TEXT NOT NULL,
    data                JSONB,
    at                  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX rx_transitions_entity ON rx_transitions (entity_type, entity_id, id);
CREATE INDEX rx_transitions_pipeline ON rx_transitions (pipeline_id, id) WHERE pipeline_id IS NOT NULL;

CREATE TABLE rx_events (
    id                  BIGSERIAL PRIMARY KEY,
    kind                TEXT NOT NULL,
    pipeline_id         BIGINT,
    queue_item_id       BIGINT,
    payload             JSONB,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX rx_events_kind ON rx_events (kind, created_at);
CREATE INDEX rx_events_pipeline ON rx_events (pipeline_id, id) WHERE pipeline_id IS NOT NULL;
