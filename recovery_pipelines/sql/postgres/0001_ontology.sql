-- The ontology job's result tables. Keyed by source so every node's upsert is idempotent.
-- Databases migrated by recovery-ext before 0.2 already have them (its migration 0002), hence IF NOT EXISTS.

CREATE TABLE IF NOT EXISTS rx_ont_entities (
    source          TEXT NOT NULL,
    table_name      TEXT NOT NULL,
    name            TEXT NOT NULL,
    description     TEXT,
    described_by    TEXT,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, table_name)
);

CREATE TABLE IF NOT EXISTS rx_ont_columns (
    source          TEXT NOT NULL,
    table_name      TEXT NOT NULL,
    column_name     TEXT NOT NULL,
    data_type       TEXT NOT NULL,
    nullable        BOOLEAN NOT NULL,
    is_primary_key  BOOLEAN NOT NULL,
    row_count       BIGINT,
    distinct_count  BIGINT,
    null_ratio      DOUBLE PRECISION,
    sample_values   JSONB,
    description     TEXT,
    described_by    TEXT,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, table_name, column_name)
);

CREATE TABLE IF NOT EXISTS rx_ont_relationships (
    source          TEXT NOT NULL,
    from_table      TEXT NOT NULL,
    from_column     TEXT NOT NULL,
    to_table        TEXT NOT NULL,
    to_column       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    confidence      DOUBLE PRECISION NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, from_table, from_column, to_table, to_column)
);

CREATE TABLE IF NOT EXISTS rx_ont_glossary_terms (
    source          TEXT NOT NULL,
    term            TEXT NOT NULL,
    definition      TEXT,
    sql_hint        TEXT,
    related_tables  JSONB,
    described_by    TEXT,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, term)
);
