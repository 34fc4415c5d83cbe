"""The ontology-extraction job as recoverable Dagster ops.

discover_schema -> profile_columns -> enrich_columns
                -> discover_entities -> enrich_entities -> discover_glossary* -> enrich_glossary*
                -> discover_relationships
all -> finalize                                              (* optional: they degrade, never fail the job)

Per-table nodes checkpoint one item per table, and each item's ontology rows are
upserted in the same transaction as its checkpoint. Every write goes through a
transaction fenced by the run's ownership epoch (``ctx.transaction()`` or
``item.complete(also=...)``), so a superseded worker writes nothing.

The source database's URL (it may carry a password) travels only through the ``source``
resource, bound to ``EnvVar("RECOVERY_SOURCE_URL")``: never through run config, node
outputs, op metadata or the IO manager.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster import ConfigurableResource, Failure, Field, In, graph, multiprocess_executor
from pydantic import Field as PydanticField
from sqlalchemy import MetaData, Table, create_engine, func, inspect, select
from sqlalchemy.engine import Engine

from recovery_ext import (ClassifiedError, NodeContext, classify, recoverable_op, redact, redact_url, run_provider_job,
                          with_recovery)
from recovery_pipelines.ontology_schema import ont_columns, ont_entities, ont_glossary_terms, ont_relationships
from recovery_pipelines.llm import entity_name

SOURCE_URL_ENV = "RECOVERY_SOURCE_URL"
SOURCE_CONFIG = {
    "source_name": Field(str, default_value="sample", description="Key of this source in the ontology tables."),
    "sample_size": Field(int, default_value=3, description="Sample values kept per column."),
}


class SourceDatabase(ConfigurableResource):
    """The database the ontology describes. Bind ``url`` to ``EnvVar("RECOVERY_SOURCE_URL")`` when it has a password."""

    url: str = PydanticField(description="SQLAlchemy URL of the database to describe. Pass secrets with EnvVar.")

    def safe_url(self) -> str:
        return redact_url(self.url)

    @contextmanager
    def engine(self) -> Iterator[Engine]:
        """An engine on the source; a bad URL fails with a redacted message and no cause chain."""
        try:
            engine = create_engine(self.url)
        except Exception as exc:  # noqa: BLE001 - ArgumentError, ValueError (bad port), missing driver
            raise Failure(description=f"cannot use the source database URL {self.safe_url()}: {redact(exc)}",
                          allow_retries=False) from None
        try:
            yield engine
        finally:
            engine.dispose()


def _source(ctx: NodeContext, schema: dict[str, Any] | None = None) -> str:
    if schema is not None:
        return schema["source"]
    return ctx.op_config["source_name"]


@recoverable_op(config_schema=SOURCE_CONFIG, required_resource_keys={"llm", "source"})
def discover_schema(ctx: NodeContext) -> dict[str, Any]:
    """Tables, columns, types, primary and foreign keys, by SQLAlchemy inspection."""
    cfg = ctx.op_config
    source_db: SourceDatabase = ctx.context.resources.source
    with source_db.engine() as engine:
        insp = inspect(engine)
        tables = []
        for name in sorted(insp.get_table_names()):
            pk = insp.get_pk_constraint(name).get("constrained_columns") or []
            tables.append({
                "name": name,
                "primary_key": pk,
                "columns": [{"name": c["name"], "type": str(c["type"]), "nullable": bool(c["nullable"]),
                             "primary_key": c["name"] in pk} for c in insp.get_columns(name)],
                "foreign_keys": [{"columns": fk["constrained_columns"], "ref_table": fk["referred_table"],
                                  "ref_columns": fk["referred_columns"]} for fk in insp.get_foreign_keys(name)],
            })
    source = cfg["source_name"]
    rows = [{"source": source, "table_name": t["name"], "column_name": c["name"], "data_type": c["type"],
             "nullable": c["nullable"], "is_primary_key": c["primary_key"]} for t in tables for c in t["columns"]]
    with ctx.transaction() as tx:
        tx.upsert(ont_columns, rows, keys=("source", "table_name", "column_name"))
    ctx.metadata.update({"tables": len(tables), "columns": len(rows), "source": source_db.safe_url()})
    return {"source": source, "sample_size": cfg["sample_size"], "tables": tables}


@recoverable_op(required_resource_keys={"source"})
def profile_columns(ctx: NodeContext, schema: dict[str, Any]) -> dict[str, Any]:
    """Row count, distinct count, null ratio and sample values per column, by SQL; one item per table."""
    source = _source(ctx, schema)
    with ctx.context.resources.source.engine() as engine:
        meta = MetaData()
        for item in ctx.items(t["name"] for t in schema["tables"]):
            table = Table(item.key, meta, autoload_with=engine)
            profile: dict[str, Any] = {}
            with engine.connect() as conn:
                total = conn.scalar(select(func.count()).select_from(table)) or 0
                for column in table.columns:
                    distinct = conn.scalar(select(func.count(func.distinct(column)))) or 0
                    nulls = conn.scalar(select(func.count()).select_from(table).where(column.is_(None))) or 0
                    samples = [str(v) for v in conn.scalars(
                        select(column).where(column.isnot(None)).distinct().order_by(column)
                        .limit(schema["sample_size"]))]
                    profile[column.name] = {"row_count": total, "distinct_count": distinct,
                                            "null_ratio": (nulls / total) if total else 0.0, "samples": samples}
            rows = [{"source": source, "table_name": item.key, "column_name": name,
                     "data_type": str(table.c[name].type), "nullable": bool(table.c[name].nullable),
                     "is_primary_key": bool(table.c[name].primary_key), "row_count": p["row_count"],
                     "distinct_count": p["distinct_count"], "null_ratio": p["null_ratio"],
                     "sample_values": p["samples"]} for name, p in profile.items()]
            item.complete(profile, also=lambda tx, rows=rows: tx.upsert(
                ont_columns, rows, keys=("source", "table_name", "column_name")))
            ctx.log.info(f"profiled table {item.key}: {len(rows)} columns, {total} rows")
    return {"source": source, "profiles": ctx.completed_items()}


@recoverable_op(required_resource_keys={"llm"})
def enrich_columns(ctx: NodeContext, schema: dict[str, Any], profiles: dict[str, Any]) -> dict[str, Any]:
    """LLM descriptions of every column; one item per table. With ``LLMResource(batch=True)`` the tables go
    to the provider as one batch job (half the price; a crash while it runs re-attaches, never resubmits)."""
    llm = ctx.context.resources.llm.enricher(ctx)
    ctx.metadata["llm"] = llm.name
    source = _source(ctx, schema)
    by_table = {t["name"]: t for t in schema["tables"]}

    def payload(key: str) -> dict[str, Any]:
        profile = profiles["profiles"].get(key, {})
        return {"table": key, "columns": [
            {"name": c["name"], "type": c["type"], "primary_key": c["primary_key"],
             "samples": profile.get(c["name"], {}).get("samples", [])} for c in by_table[key]["columns"]]}

    def rows_of(key: str, answer: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"source": source, "table_name": key, "column_name": c["name"], "data_type": c["type"],
                 "nullable": c["nullable"], "is_primary_key": c["primary_key"],
                 "description": str(answer.get(c["name"], ""))[:2000], "described_by": llm.name}
                for c in by_table[key]["columns"]]

    def keep(key: str, answer: dict[str, Any]) -> None:
        rows = rows_of(key, answer)
        described = len([r for r in rows if r["description"]])
        ctx.checkpoint(key, {"described": described}, also=lambda tx: (
            tx.upsert(ont_columns, rows, keys=("source", "table_name", "column_name"))))
        # one line per item: the walkthrough's cue that the step is under way (and how far)
        ctx.log.info(f"llm {llm.name} described table {key}: {described}/{len(rows)} columns")

    jobs = getattr(llm, "batch_jobs", None)
    if ctx.context.resources.llm.batch and jobs is not None:
        requests = {key: llm.request_body("describe_columns", payload(key)) for key in by_table}
        run_provider_job(ctx, jobs(), requests, poll_seconds=ctx.context.resources.llm.batch_poll_seconds,
                         keep=lambda key, answer: keep(key, llm.answer_of(answer).get("columns", {})),
                         prices=llm.prices)
    else:
        for item in ctx.items(by_table):
            keep(item.key, llm.complete_json("describe_columns", payload(item.key)).get("columns", {}))
    return {"source": source, "tables": len(by_table)}


@recoverable_op
def discover_entities(ctx: NodeContext, schema: dict[str, Any]) -> dict[str, Any]:
    """One business entity per table, named from the table until the LLM names it better."""
    source = _source(ctx, schema)
    link_tables = {t["name"] for t in schema["tables"]
                   if len(t["foreign_keys"]) >= 2 and len(t["columns"]) <= len(t["foreign_keys"]) + 1}
    entities = [{"table": t["name"], "name": entity_name(t["name"]), "columns": [c["name"] for c in t["columns"]]}
                for t in schema["tables"] if t["name"] not in link_tables]
    with ctx.transaction() as tx:
        tx.upsert(ont_entities, [{"source": source, "table_name": e["table"], "name": e["name"],
                                  "described_by": "table name"} for e in entities], keys=("source", "table_name"))
    ctx.metadata["entities"] = len(entities)
    return {"source": source, "entities": entities}


@recoverable_op(required_resource_keys={"llm"})
def enrich_entities(ctx: NodeContext, entities: dict[str, Any]) -> dict[str, Any]:
    """LLM names and descriptions; on failure it keeps the names derived from tables, with a warning."""
    llm = ctx.context.resources.llm.enricher(ctx)
    ctx.metadata["llm"] = llm.name
    source = entities["source"]
    fallbacks = 0
    for item in ctx.items(e["table"] for e in entities["entities"]):
        entity = next(e for e in entities["entities"] if e["table"] == item.key)
        try:
            answer = llm.complete_json("describe_entity", {"table": item.key, "columns": entity["columns"]})
            name, description, by = str(answer.get("name") or entity["name"]), answer.get("description"), llm.name
        except ClassifiedError as exc:  # the provider failed for good: the ontology is still useful with derived names
            found = classify(exc)
            ctx.log.warning(f"entity enrichment failed for {item.key} ({found.category}); using the table name as "
                            f"fallback, recorded as degraded: {redact(exc)}")
            name, description, by = entity["name"], f"Rows of the {item.key} table.", "table name (fallback)"
            fallbacks += 1
        row = {"source": source, "table_name": item.key, "name": name, "description": description, "described_by": by}
        record = item.degrade if by == "table name (fallback)" else item.complete
        record({"name": name, "description": description},
               also=lambda tx, row=row: tx.upsert(ont_entities, [row], keys=("source", "table_name")))
        ctx.log.info(f"llm {by} named table {item.key}: {name}")
    ctx.metadata["fallbacks"] = fallbacks
    done = ctx.completed_items()
    return {"source": source, "entities": [{"table": e["table"], "name": done[e["table"]]["name"]}
                                           for e in entities["entities"]]}


def conventional_target(column: str, tables: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """``customer_id`` -> ``customers.id`` (or ``customer.id``), when that table has an ``id`` key."""
    if not column.endswith("_id") or column == "id":
        return None
    stem = column[:-3]
    for candidate in (stem + "s", stem + "es", stem[:-1] + "ies" if stem.endswith("y") else None, stem):
        if candidate and candidate in tables and "id" in tables[candidate]["primary_key"]:
            return candidate, "id"
    return None


@recoverable_op
def discover_relationships(ctx: NodeContext, schema: dict[str, Any]) -> dict[str, Any]:
    """Declared foreign keys plus naming conventions such as ``customer_id`` -> ``customers.id``."""
    source = _source(ctx, schema)
    tables = {t["name"]: t for t in schema["tables"]}
    found: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for t in schema["tables"]:
        declared_cols = set()
        for fk in t["foreign_keys"]:
            for col, ref in zip(fk["columns"], fk["ref_columns"], strict=False):
                declared_cols.add(col)
                found[(t["name"], col, fk["ref_table"], ref)] = {"kind": "declared", "confidence": 1.0}
        for c in t["columns"]:
            if c["name"] in declared_cols:
                continue
            target = conventional_target(c["name"], tables)
            if target:
                found[(t["name"], c["name"], *target)] = {"kind": "convention", "confidence": 0.8}
    rows = [{"source": source, "from_table": k[0], "from_column": k[1], "to_table": k[2], "to_column": k[3], **v}
            for k, v in sorted(found.items())]
    with ctx.transaction() as tx:
        tx.upsert(ont_relationships, rows, keys=("source", "from_table", "from_column", "to_table", "to_column"))
    ctx.metadata.update({"declared": sum(r["kind"] == "declared" for r in rows),
                         "conventional": sum(r["kind"] == "convention" for r in rows)})
    return {"source": source, "relationships": rows}


@recoverable_op(optional=True, required_resource_keys={"llm"})
def discover_glossary(ctx: NodeContext, entities: dict[str, Any]) -> dict[str, Any]:
    """Business terms from the LLM (optional: a failure degrades this node, the ontology stays useful)."""
    llm = ctx.context.resources.llm.enricher(ctx)
    ctx.metadata["llm"] = llm.name
    answer = llm.complete_json("glossary", {"entities": entities["entities"]})
    terms = [t for t in answer.get("terms", []) if isinstance(t, dict) and t.get("term")]
    rows = [{"source": entities["source"], "term": str(t["term"])[:200], "definition": t.get("definition"),
             "related_tables": list(t.get("tables") or []), "described_by": llm.name} for t in terms]
    with ctx.transaction() as tx:
        tx.upsert(ont_glossary_terms, rows, keys=("source", "term"))
    return {"source": entities["source"], "terms": [{k: r[k] for k in ("term", "definition", "related_tables")}
                                                    for r in rows]}


@recoverable_op(optional=True, required_resource_keys={"llm"})
def enrich_glossary(ctx: NodeContext, glossary: dict[str, Any] | None) -> dict[str, Any]:
    """Precise definitions and SQL for each term; one item per term (optional)."""
    if not glossary:
        ctx.log.warning("glossary discovery degraded; nothing to enrich")
        return {"source": None, "enriched": 0}
    llm = ctx.context.resources.llm.enricher(ctx)
    ctx.metadata["llm"] = llm.name
    terms = {t["term"]: t for t in glossary["terms"]}
    for item in ctx.items(terms):
        term = terms[item.key]
        answer = llm.complete_json("enrich_term", {"term": item.key, "definition": term.get("definition"),
                                                   "tables": term.get("related_tables") or []})
        row = {"source": glossary["source"], "term": item.key, "definition": answer.get("definition"),
               "sql_hint": answer.get("sql"), "related_tables": term.get("related_tables") or [],
               "described_by": llm.name}
        item.complete({"sql": row["sql_hint"]}, also=lambda tx, row=row: tx.upsert(
            ont_glossary_terms, [row], keys=("source", "term")))
        ctx.log.info(f"llm {llm.name} enriched glossary term {item.key}")
    return {"source": glossary["source"], "enriched": len(ctx.completed_items())}


@recoverable_op(ins={"columns": In(), "entities": In(), "relationships": In(), "glossary": In()})
def finalize(ctx: NodeContext, columns, entities, relationships, glossary) -> dict[str, Any]:
    """The ontology's summary: what was found, and which optional parts degraded."""
    source = entities["source"]
    with ctx.read() as conn:
        counts = {table.name.replace("rx_ont_", ""): conn.scalar(
            select(func.count()).select_from(table).where(table.c.source == source))
            for table in (ont_entities, ont_columns, ont_relationships, ont_glossary_terms)}
    degraded = [name for name, status in ctx.node_statuses().items() if status == "degraded"]
    ctx.metadata.update({**counts, "degraded": ", ".join(degraded) or "none"})
    return {"source": source, **counts, "degraded": degraded}


@graph(description="Describe a database: schema, profiles, LLM descriptions, entities, relationships, glossary.")
def ontology_graph():
    schema = discover_schema()
    profiles = profile_columns(schema)
    described = enrich_columns(schema, profiles)
    entities = discover_entities(schema)
    named = enrich_entities(entities)
    relationships = discover_relationships(schema)
    glossary = enrich_glossary(discover_glossary(named))
    finalize(columns=described, entities=named, relationships=relationships, glossary=glossary)


__all__ = ["SOURCE_URL_ENV", "SourceDatabase", "conventional_target", "make_ontology_job", "ontology_graph"]


def make_ontology_job(*, source_name: str = "sample", name: str = "ontology_extraction",
                      executor_def=multiprocess_executor):
    """The ontology job. It reads the source through a ``source`` resource: give it
    ``SourceDatabase(url=EnvVar("RECOVERY_SOURCE_URL"))`` in your ``Definitions``."""
    config = {"ops": {"discover_schema": {"config": {"source_name": source_name}}}}
    return ontology_graph.to_job(name=name, executor_def=with_recovery(executor_def), config=config,
                                 tags={"recovery/pipeline": "ontology"})
