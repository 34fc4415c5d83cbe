-- Provider outages (issue 10): a pipeline paused by an outage shows as waiting, and one
-- circuit breaker per endpoint is shared by every pipeline of the deployment.

ALTER TABLE rx_pipelines ADD COLUMN waiting_until REAL;
ALTER TABLE rx_pipelines ADD COLUMN waiting_since REAL;
ALTER TABLE rx_pipelines ADD COLUMN waiting_reason TEXT;

CREATE TABLE rx_circuit_breakers (
    endpoint              TEXT PRIMARY KEY,
    state                 TEXT NOT NULL DEFAULT 'closed',
    consecutive_failures  INTEGER NOT NULL DEFAULT 0,
    open_count            INTEGER NOT NULL DEFAULT 0,
    opened_at             REAL,
    open_until            REAL,
    probe_owner           TEXT,
    probe_deadline        REAL,
    last_error            TEXT,
    updated_at            REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

CREATE INDEX rx_node_items_degraded ON rx_node_items (pipeline_id, node_name) WHERE status = 'degraded';
