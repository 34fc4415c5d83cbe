-- Spend caps: at most so many tokens, or so much money, per pipeline (scope 'pipeline:<id>') and per
-- deployment (scope 'deployment:<name>'). Every provider request and job submission first reserves its
-- estimate with one conditional UPDATE of the cap's row (spent + reserved + estimate <= cap), and
-- inserts its reservation in the same transaction; the answer's usage moves it from reserved to spent.
-- A reservation whose process died stays counted until its job's results (by ref, the job's token)
-- settle it. configured_* is what the run configuration last asked for: a cap an operator raised
-- stays raised until the configuration itself changes.

CREATE TABLE rx_spend_caps (
    scope              TEXT PRIMARY KEY,
    max_tokens         INTEGER,
    max_cost           REAL,
    configured_tokens  INTEGER,
    configured_cost    REAL,
    spent_tokens       INTEGER NOT NULL DEFAULT 0,
    spent_cost         REAL NOT NULL DEFAULT 0,
    reserved_tokens    INTEGER NOT NULL DEFAULT 0,
    reserved_cost      REAL NOT NULL DEFAULT 0,
    changed_by         TEXT,
    updated_at         REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

CREATE TABLE rx_spend_reservations (
    id           INTEGER PRIMARY KEY,
    scope        TEXT NOT NULL,
    pipeline_id  INTEGER NOT NULL,
    epoch        INTEGER NOT NULL,
    ref          TEXT,
    tokens       INTEGER NOT NULL DEFAULT 0,
    cost         REAL NOT NULL DEFAULT 0,
    reserved_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

CREATE INDEX rx_spend_reservations_scope ON rx_spend_reservations (scope);
-- a prune deletes a finished pipeline's reservations by its id
CREATE INDEX rx_spend_reservations_pipeline ON rx_spend_reservations (pipeline_id);
CREATE INDEX rx_spend_reservations_ref ON rx_spend_reservations (ref) WHERE ref IS NOT NULL;
