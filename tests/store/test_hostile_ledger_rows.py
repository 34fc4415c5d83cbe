"""One corrupt ledger row never stops the figures of the others: ``costs``, every metrics scrape and the
report leave it out, count it and say so (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from prometheus_client import generate_latest
from sqlalchemy import update

from recovery_ext._cli import main
from recovery_ext._observe.exporter import registry_for
from recovery_ext._store.models import ItemCheckpoint, ProviderCall
from recovery_ext._store.schema import provider_calls
import store_rows


def _pipeline_with_calls(store, job, n, tokens_in=10):
    own = store.pipelines.create_pipeline(job, ["a"], owner=f"run-{job}", origin_run_id=f"run-{job}", params={})
    store.pipelines.start_node(own, "a")
    calls = [ProviderCall(endpoint="http://127.0.0.1:9/v1", model="m", tokens_in=tokens_in, tokens_out=1, cost=0.5)
             for _ in range(n)]
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k", 1, calls=tuple(calls)))
    return own, calls


def _corrupt(store, call_id, **values):
    with store.write() as conn:
        conn.execute(update(provider_calls).where(provider_calls.c.id == call_id).values(**values))


def corrupt_rows(store, calls):
    """What each database lets a foreign writer leave behind: SQLite an infinite or textual token count,
    PostgreSQL an infinite or NaN cost; both a negative count."""
    if store.dialect.name == "sqlite":
        with store.write() as conn:
            conn.exec_driver_sql("UPDATE rx_provider_calls SET tokens_in = 1e999 WHERE id = ?", (calls[0].id,))
            conn.exec_driver_sql("UPDATE rx_provider_calls SET tokens_out = 'many' WHERE id = ?", (calls[1].id,))
    else:
        _corrupt(store, calls[0].id, cost=float("inf"))
        _corrupt(store, calls[1].id, cost=float("nan"))
    _corrupt(store, calls[2].id, tokens_in=-5)
    _corrupt(store, calls[3].id, latency_seconds=float("inf"))


def test_corrupt_ledger_rows_are_left_out_counted_and_shown_never_fail_costs_or_scrapes(store, db_url, tmp_path):
    good, _ = _pipeline_with_calls(store, "good", 2)
    bad, calls = _pipeline_with_calls(store, "bad", 5)
    corrupt_rows(store, calls)

    result = CliRunner().invoke(main, ["--database-url", db_url, "--json", "costs"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["skipped_rows"] == 4 and "4 ledger row(s) left out" in result.stderr
    by_id = {p["pipeline_id"]: p for p in report["pipelines"]}
    assert (by_id[good.pipeline_id]["calls"], by_id[good.pipeline_id]["tokens_in"]) == (2, 20)
    assert (by_id[bad.pipeline_id]["calls"], by_id[bad.pipeline_id]["tokens_in"]) == (1, 10)
    one = CliRunner().invoke(main, ["--database-url", db_url, "--json", "costs", str(bad.pipeline_id)])
    assert one.exit_code == 0 and json.loads(one.stdout)["skipped_rows"] == 4

    scraped = generate_latest(registry_for(store)).decode()
    assert "recovery_database_up 1.0" in scraped
    assert "recovery_ledger_rows_skipped 4.0" in scraped
    assert 'recovery_provider_tokens_total{dagster_job="good",model="m",type="input"} 20.0' in scraped
    assert len(store_rows.provider_calls(store)) == 3  # the readable rows; the corrupt ones are counted, not raised

    page = CliRunner().invoke(main, ["--database-url", db_url, "report", str(bad.pipeline_id), "--html",
                                     str(tmp_path / "report.html")])
    assert page.exit_code == 0, page.output
    assert "4 ledger row(s) left out" in (tmp_path / "report.html").read_text()
