-- Request and token budgets per provider endpoint (and optionally per model), shared by every
-- process: a call reserves its estimated tokens in rx_rate_reservations, and the response's usage
-- corrects the reservation. The budget row is the lock a reservation takes (FOR UPDATE; on SQLite
-- the writer lock) before it counts what the window already holds, so two processes never both
-- take the last request of a window. Times are the database clock. model is '' for a budget of the
-- whole endpoint.

CREATE TABLE rx_rate_budgets (
    endpoint             TEXT NOT NULL,
    model                TEXT NOT NULL DEFAULT '',
    requests_per_minute  INTEGER,
    tokens_per_minute    BIGINT,
    window_seconds       DOUBLE PRECISION NOT NULL DEFAULT 60,
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint, model)
);

CREATE TABLE rx_rate_reservations (
    id           BIGSERIAL PRIMARY KEY,
    endpoint     TEXT NOT NULL,
    model        TEXT NOT NULL DEFAULT '',
    holder       TEXT,
    tokens       BIGINT NOT NULL DEFAULT 0,
    reserved_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX rx_rate_reservations_window ON rx_rate_reservations (endpoint, model, reserved_at);
