-- The ontology job's result tables. Keyed by source so every node's upsert is idempotent.
-- Databases migrated by recovery-ext before 0.2 already have them (its migration 0002), hence IF NOT EXISTS.

CREATE TABLE IF NOT EXISTS rx_ont_entities (
    source          TEXT NOT NULL,
    table_name      TEXT NOT NULL,
    name            TEXT NOT NULL,
    description     TEXT,
    described_by    TEXT,
    updated_at      REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (source, table_name)
);

CREATE TABLE IF NOT EXISTS rx_ont_columns (
    source          TEXT NOT NULL,
    table_name      TEXT NOT NULL,
    column_name     TEXT NOT NULL,
    data_type       TEXT NOT NULL,
    nullable        INTEGER NOT NULL,
    is_primary_key  INTEGER NOT NULL,
    row_count       BIGINT,
    distinct_count  BIGINT,
    null_ratio      REAL,
    sample_values   TEXT,
    description     TEXT,
    described_by    TEXT,
    updated_at      REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (source, table_name, column_name)
);

CREATE TABLE IF NOT EXISTS rx_ont_relationships (
    source          TEXT NOT NULL,
    from_table      TEXT NOT NULL,
    from_column     TEXT NOT NULL,
    to_table        TEXT NOT NULL,
    to_column       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    confidence      REAL NOT NULL,
    updated_at      REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (source, from_table, from_column, to_table, to_column)
);

CREATE TABLE IF NOT EXISTS rx_ont_glossary_terms (
    source          TEXT NOT NULL,
    term            TEXT NOT NULL,
    definition      TEXT,
    sql_hint        TEXT,
    related_tables  TEXT,
    described_by    TEXT,
    updated_at      REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    PRIMARY KEY (source, term)
);
