-- Spend caps: at most so many tokens, or so much money, per pipeline (scope 'pipeline:<id>') and per
-- deployment (scope 'deployment:<name>'). Every provider request and job submission first reserves its
-- estimate with one conditional UPDATE of the cap's row (spent + reserved + estimate <= cap), and
-- inserts its reservation in the same transaction; the answer's usage moves it from reserved to spent.
-- A reservation whose process died stays counted until its job's results (by ref, the job's token)
-- settle it. configured_* is what the run configuration last asked for: a cap an operator raised
-- stays raised until the configuration itself changes.

CREATE TABLE rx_spend_caps (
    scope              TEXT PRIMARY KEY,
    max_tokens         BIGINT,
    max_cost           DOUBLE PRECISION,
    configured_tokens  BIGINT,
    configured_cost    DOUBLE PRECISION,
    spent_tokens       BIGINT NOT NULL DEFAULT 0,
    spent_cost         DOUBLE PRECISION NOT NULL DEFAULT 0,
    reserved_tokens    BIGINT NOT NULL DEFAULT 0,
    reserved_cost      DOUBLE PRECISION NOT NULL DEFAULT 0,
    changed_by         TEXT,
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE rx_spend_reservations (
    id           BIGSERIAL PRIMARY KEY,
    scope        TEXT NOT NULL,
    pipeline_id  BIGINT NOT NULL,
    epoch        INTEGER NOT NULL,
    ref          TEXT,
    tokens       BIGINT NOT NULL DEFAULT 0,
    cost         DOUBLE PRECISION NOT NULL DEFAULT 0,
    reserved_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX rx_spend_reservations_scope ON rx_spend_reservations (scope);
-- a prune deletes a finished pipeline's reservations by its id
CREATE INDEX rx_spend_reservations_pipeline ON rx_spend_reservations (pipeline_id);
CREATE INDEX rx_spend_reservations_ref ON rx_spend_reservations (ref) WHERE ref IS NOT NULL;
