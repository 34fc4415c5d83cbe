"""Tables the ontology job upserts into (this package's migration 0001, ``sql/<dialect>/0001_ontology.sql``)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Float, MetaData, Table, Text

from recovery_ext.store import DbJson, DbTime

MIGRATIONS = "recovery_pipelines"  # RecoveryResource(migration_packages=[MIGRATIONS])
metadata = MetaData()

ont_entities = Table(
    "rx_ont_entities", metadata,
    Column("source", Text, primary_key=True), Column("table_name", Text, primary_key=True),
    Column("name", Text, nullable=False), Column("description", Text), Column("described_by", Text),
    Column("updated_at", DbTime, nullable=False),
)

ont_columns = Table(
    "rx_ont_columns", metadata,
    Column("source", Text, primary_key=True), Column("table_name", Text, primary_key=True),
    Column("column_name", Text, primary_key=True), Column("data_type", Text, nullable=False),
    Column("nullable", Boolean, nullable=False), Column("is_primary_key", Boolean, nullable=False),
    Column("row_count", BigInteger), Column("distinct_count", BigInteger), Column("null_ratio", Float),
    Column("sample_values", DbJson), Column("description", Text), Column("described_by", Text),
    Column("updated_at", DbTime, nullable=False),
)

ont_relationships = Table(
    "rx_ont_relationships", metadata,
    Column("source", Text, primary_key=True), Column("from_table", Text, primary_key=True),
    Column("from_column", Text, primary_key=True), Column("to_table", Text, primary_key=True),
    Column("to_column", Text, primary_key=True), Column("kind", Text, nullable=False),
    Column("confidence", Float, nullable=False), Column("updated_at", DbTime, nullable=False),
)

ont_glossary_terms = Table(
    "rx_ont_glossary_terms", metadata,
    Column("source", Text, primary_key=True), Column("term", Text, primary_key=True),
    Column("definition", Text), Column("sql_hint", Text), Column("related_tables", DbJson),
    Column("described_by", Text), Column("updated_at", DbTime, nullable=False),
)
