-- recovery-ext schema, SQLite (the embedded default). Times are Unix epoch seconds (REAL) on the database clock.
-- Applied by `recovery-ext migrate`; recorded in rx_schema_migrations.
-- Every live-row scan has a partial index over live rows only, so a million finished
-- pipelines cost the recovery scan nothing.

CREATE TABLE rx_pipelines (
    id                  INTEGER PRIMARY KEY,
    job_name            TEXT NOT NULL,
    origin_run_id       TEXT UNIQUE,
    params              TEXT NOT NULL DEFAULT '{}',
    status              TEXT NOT NULL DEFAULT 'pending',
    current_node        TEXT,
    owner               TEXT,
    resumed_from        TEXT,
    epoch               INTEGER NOT NULL DEFAULT 0,
    heartbeat_at        REAL,
    heartbeat_deadline  REAL,
    deadline            REAL,
    resume_count        INTEGER NOT NULL DEFAULT 0,
    max_resumes         INTEGER NOT NULL DEFAULT 3,
    created_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    started_at          REAL,
    updated_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    completed_at        REAL,
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
    id                  INTEGER PRIMARY KEY,
    pipeline_id         BIGINT NOT NULL REFERENCES rx_pipelines (id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    position            INTEGER NOT NULL,
    status              TEXT NOT NULL DEFAULT 'pending',
    optional            INTEGER NOT NULL DEFAULT 0,
    attempts            INTEGER NOT NULL DEFAULT 0,
    items_total         INTEGER,
    error               TEXT,
    error_category      TEXT,
    error_status_code   INTEGER,
    run_id              TEXT,
    started_at          REAL,
    completed_at        REAL,
    updated_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    heartbeat_at        REAL,
    heartbeat_deadline  REAL,
    stall_deadline      REAL,
    output              TEXT,
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
    result              TEXT,
    run_id              TEXT,
    epoch               INTEGER,
    completed_at        REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (pipeline_id, node_name, item_key)
);

CREATE TABLE rx_queue_items (
    id                  INTEGER PRIMARY KEY,
    queue               TEXT NOT NULL,
    dedupe_key          TEXT,
    payload             TEXT NOT NULL DEFAULT '{}',
    status              TEXT NOT NULL DEFAULT 'ready',
    worker              TEXT,
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL DEFAULT 3,
    created_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    updated_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    started_at          REAL,
    heartbeat_deadline  REAL,
    completed_at        REAL,
    result              TEXT,
    last_error          TEXT,
    last_error_at       REAL,
    CONSTRAINT rx_queue_items_dedupe UNIQUE (queue, dedupe_key)
);
CREATE INDEX rx_queue_ready ON rx_queue_items (queue, id) WHERE status = 'ready';
CREATE INDEX rx_queue_processing ON rx_queue_items (queue, started_at) WHERE status = 'processing';
CREATE INDEX rx_queue_dead ON rx_queue_items (queue, id) WHERE status = 'dead';

CREATE TABLE rx_transitions (
    id                  INTEGER PRIMARY KEY,
    entity_type         TEXT NOT NULL,
    entity_id           BIGINT NOT NULL,
    pipeline_id         BIGINT,
    from_status         TEXT,
    to_status           TEXT NOT NULL,
    event               TEXT NOT NULL,
    data                TEXT,
    at                  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);
CREATE INDEX rx_transitions_entity ON rx_transitions (entity_type, entity_id, id);
CREATE INDEX rx_transitions_pipeline ON rx_transitions (pipeline_id, id) WHERE pipeline_id IS NOT NULL;

CREATE TABLE rx_events (
    id                  INTEGER PRIMARY KEY,
    kind                TEXT NOT NULL,
    pipeline_id         BIGINT,
    queue_item_id       BIGINT,
    payload             TEXT,
    created_at          REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);
CREATE INDEX rx_events_kind ON rx_events (kind, created_at);
CREATE INDEX rx_events_pipeline ON rx_events (pipeline_id, id) WHERE pipeline_id IS NOT NULL;
