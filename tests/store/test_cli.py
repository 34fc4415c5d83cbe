"""The operator CLI against both databases, including bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import expire
from recovery_ext._cli import main
from recovery_ext._store.dialects import Dialect
from recovery_ext._store.migrations import load_migrations
from recovery_ext._store.models import ItemCheckpoint


def as_json(result):
    return json.loads(result.stdout)


ROOT_SQL = Path(__file__).resolve().parents[2] / "sql"


def test_migrate_print_and_apply(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    runner = CliRunner()
    printed = runner.invoke(main, ["--database-url", url, "migrate", "--print"])
    assert printed.exit_code == 0 and "CREATE TABLE rx_pipelines" in printed.stdout
    status = runner.invoke(main, ["--database-url", url, "status"])
    assert status.exit_code == 1 and "recovery-ext migrate" in status.output
    applied = runner.invoke(main, ["--database-url", url, "--json", "migrate"])
    expected = [f"{m.version:04d}_{m.name}" for m in load_migrations(Dialect.for_url(url))]
    assert json.loads(applied.stdout) == {"applied": expected} and expected[:2] == ["0001_init", "0002_ontology"]
    again = runner.invoke(main, ["--database-url", url, "migrate"])
    assert "up to date" in again.stdout


def test_status_reports_orphans_stuck_dead_and_recovered(cli, store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="r1", origin_run_id="r1")
    expire(store, own.pipeline_id)
    store.queue.enqueue("ocr", [{"name": "a.pdf"}, {"name": "b.pdf"}], max_attempts=1)
    stuck, dead = store.queue.claim("ocr", "w", limit=2, heartbeat_timeout=600)
    store.queue.fail_item(dead, "boom")
    from sqlalchemy import update

    from recovery_ext._store.schema import queue_items

    with store.write() as conn:  # its worker stopped heartbeating
        conn.execute(update(queue_items).where(queue_items.c.id == stuck.id)
                     .values(started_at=store.dialect.now_plus(-3600), heartbeat_deadline=store.dialect.now_plus(-1)))
    data = as_json(cli("status", "--json"))
    assert [o["id"] for o in data["orphans"]] == [own.pipeline_id]
    assert [(i["id"], i["reason"]) for i in data["stuck_items"]] == [(stuck.id, "heartbeat expired")]
    assert [i["id"] for i in data["dead_items"]] == [dead.id]
    human = cli("status").stdout
    assert "Orphans now: 1" in human and "Dead items: 1" in human
    told = cli("recover").stdout  # a person is told who resumes it: this command launches no run
    assert "found 1 orphan(s): 1 reclaimed (awaiting their resume run)" in told
    assert f"pipeline {own.pipeline_id} (job) resume #1" in told
    assert "launched by the orphan sensor (make_orphan_sensor)" in told and "dagster-daemon run" in told
    assert "orphan sensor" not in cli("recover").stdout  # nothing reclaimed now: nothing to wait for
    assert as_json(cli("status", "--json"))["auto_recovered_24h"]["pipelines"] == 1


def test_pipelines_show_and_list(cli, store):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner="r1", origin_run_id="r1")
    store.pipelines.start_node(own, "a")
    store.pipelines.start_items(own, "a", 3)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1))
    data = as_json(cli("pipelines", "show", str(own.pipeline_id), "--json"))
    assert [(n["name"], n["status"], n["items_done"], n["items_total"]) for n in data["nodes"]] == [
        ("a", "running", 1, 3), ("b", "pending", 0, None)]
    assert data["transitions"][0]["event"] == "created"
    human = cli("pipelines", "show", str(own.pipeline_id)).stdout
    assert "1/3" in human and "Transitions" in human
    transitions = human.split("Transitions", 1)[1]
    assert "node a " in transitions and f"pipeline {own.pipeline_id} " in transitions  # named, not row ids
    assert str(own.pipeline_id) in cli("pipelines", "list").stdout
    assert "no pipeline 999" in cli("pipelines", "show", "999", code=1).output


def test_pipelines_show_prints_no_empty_gave_up_for_a_failed_pipeline(cli, store):
    """Before: ``error: ... (and 3 more)  gave up: `` ended a failed pipeline's line, with no reason after it."""
    from recovery_ext._store.models import ErrorInfo

    own = store.pipelines.create_pipeline("job", ["a"], owner="r1", origin_run_id="r1")
    store.pipelines.start_node(own, "a")
    store.pipelines.fail_node(own, "a", ErrorInfo(category="validation", message="8 item(s) failed (and 3 more)"),
                              permanent=True)
    [line] = [ln for ln in cli("pipelines", "show", str(own.pipeline_id)).stdout.splitlines() if "error:" in ln]
    assert line.strip() == "error: 8 item(s) failed (and 3 more)"


def test_reset_stuck_dry_run_job_id_and_summary(cli, store):
    store.queue.enqueue("ocr", [{"name": "a.pdf"}, {"name": "b.pdf"}])
    a, b = store.queue.claim("ocr", "worker-1", limit=2, heartbeat_timeout=600)
    from sqlalchemy import update

    from recovery_ext._store.schema import queue_items

    with store.write() as conn:  # legacy rows: no heartbeat deadline, started 20 min ago
        conn.execute(update(queue_items).values(started_at=store.dialect.now_plus(-1200), heartbeat_deadline=None))
    dry = cli("reset-stuck", "--dry-run")
    assert "found 2 stuck item(s)" in dry.stdout and "dry run: nothing was changed" in dry.stdout
    assert store.queue.get_item(a.id).status == "processing"
    one = cli("reset-stuck", "--job-id", str(a.id))
    assert f"item {a.id} (ocr): processing" in one.output and "reset 1 stuck item(s)" in one.stdout
    # the same voice as the other commands: no banner of its own
    assert not [line for result in (dry, one) for line in result.output.splitlines() if line.startswith("===")]
    assert "threshold 10 min" in dry.output
    assert store.queue.get_item(a.id).status == "ready" and store.queue.get_item(b.id).status == "processing"
    assert as_json(cli("reset-stuck", "--threshold", "25m", "--json"))["reset"] == []
    rest = as_json(cli("reset-stuck", "--threshold", "15m", "--json"))
    assert rest["reset"] == [{"id": b.id, "new_status": "ready"}]


def test_retry_dead(cli, store):
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}], max_attempts=1)
    for item in store.queue.claim("ocr", "w", limit=2):
        store.queue.fail_item(item, "boom")
    first, second = [i.id for i in store.queue.list_items("ocr")]
    assert as_json(cli("retry-dead", str(first), "--json")) == {"retried": [first]}
    assert "not dead" in cli("retry-dead", str(first), code=1).output
    assert as_json(cli("retry-dead", "--all", "--json")) == {"retried": [second]}
    assert "item IDs or --all" in cli("retry-dead", code=2).output


@pytest.mark.parametrize("args,code,text", [
    (["--database-url", "mysql://x@localhost/db", "status"], 2, "unsupported database"),
    (["--database-url", "not a url", "status"], 2, "not a database URL"),
    (["status", "--database-url", "not a url"], 2, "not a database URL"),  # after the command: it stands
    (["--database-url", "postgresql://postgres@127.0.0.1:99999/x", "status"], 2, "port 99999 is not from 1 to 65535"),
    (["--database-url", "postgresql://postgres@127.0.0.1:1/nope", "status"], 1, "cannot reach the database"),
    (["reset-stuck", "--threshold", "soon"], 2, "not a duration"),
    (["pipelines", "show", "0"], 2, "Invalid value"),
    (["retry-dead", "abc"], 2, "Invalid value"),
    (["nonsense"], 2, "No such command"),
])
def test_bad_input_is_rejected_clearly(args, code, text, tmp_path):
    result = CliRunner().invoke(main, ["--database-url", f"sqlite:///{tmp_path}/x.sqlite3", *args])
    assert result.exit_code == code and text in result.output
    assert "Traceback" not in result.output


def test_the_database_url_may_follow_the_command_as_the_docs_say(tmp_path):
    """A new user's trial: ``recovery-ext status --database-url URL`` was "No such option" (exit 2)."""
    url = f"sqlite:///{tmp_path}/after.sqlite3"
    assert CliRunner().invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    result = CliRunner().invoke(main, ["status", "--json", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["pipelines"] == []


@pytest.mark.parametrize("url,text", [
    ("postgres:S3cretPW@127.0.0.1/trial_app", "not a database URL: postgres:***@127.0.0.1/trial_app"),
    ("postgresql:S3cretPW@127.0.0.1/x?sslmode=require", "not a database URL: postgresql:***@127.0.0.1/x?sslmode"),
    ("postgres:S3c?retPW@127.0.0.1/x", "not a database URL: postgres:***@127.0.0.1/x"),
    ("postgresql://postgres:S3c@ret@127.0.0.1:5432/x", "its password holds '@'; write it percent-encoded, as %40"),
])
def test_a_malformed_database_url_shows_no_part_of_its_password(url, text):
    """A new user's trial: a URL without its "//" was echoed whole; a password holding "@" ended at it, so the
    driver's error named the rest of it as the host ("failed to resolve host 'ret@127.0.0.1'")."""
    result = CliRunner().invoke(main, ["--database-url", url, "status"])
    assert result.exit_code == 2 and text in result.output
    assert "S3c" not in result.output and "ret" not in result.output and "Traceback" not in result.output


def test_status_reset_stuck_and_the_sensor_never_call_a_heartbeating_item_stuck(cli, store):
    from sqlalchemy import update

    from recovery_ext._store.schema import queue_items

    store.queue.enqueue("ocr", [{"name": "slow.pdf"}])
    (slow,) = store.queue.claim("ocr", "worker-1", heartbeat_timeout=600)
    with store.write() as conn:  # started an hour ago, still heartbeating
        conn.execute(update(queue_items).values(started_at=store.dialect.now_plus(-3600)))
    assert as_json(cli("status", "--json", "--threshold", "1m"))["stuck_items"] == []
    store.queue.enqueue("ocr", [{"name": "flaky.pdf"}])
    (flaky,) = store.queue.claim("ocr", "worker-2")
    store.queue.fail_item(flaky, "timeout: OCR engine timed out")
    (waiting,) = as_json(cli("status", "--json"))["waiting_items"]
    assert (waiting["id"], waiting["attempts"]) == (flaky.id, 1) and waiting["available_at"]
    assert "Items waiting for their retry delay: 1" in cli("status").stdout
    assert as_json(cli("reset-stuck", "--threshold", "1m", "--json"))["reset"] == []
    assert store.queue.get_item(slow.id).status == "processing"


def test_status_and_pipelines_list_show_and_filter_by_deployment(cli, store):
    blue = store.pipelines.create_pipeline("job", ["a"], owner="r-blue", origin_run_id="r-blue", deployment="blue")
    green = store.pipelines.create_pipeline("job", ["a"], owner="r-green", origin_run_id="r-green", deployment="green")
    listed = as_json(cli("pipelines", "list", "--deployment", "blue", "--json"))
    assert [(p["id"], p["deployment"]) for p in listed] == [(blue.pipeline_id, "blue")]
    every = {p["id"]: p["deployment"] for p in as_json(cli("pipelines", "list", "--json"))}
    assert every == {blue.pipeline_id: "blue", green.pipeline_id: "green"}
    summary = as_json(cli("status", "--deployment", "green", "--json"))["pipelines"]
    assert [(r["deployment"], r["status"], r["count"]) for r in summary] == [("green", "running", 1)]
    assert "deployment" in cli("pipelines", "list").stdout and "blue" in cli("status").stdout
    for known in (["status", "--deployment", "green"], ["pipelines", "list", "--deployment", "blue"]):
        assert "no pipeline of deployment" not in cli(*known).stderr


@pytest.mark.parametrize("command", [["status"], ["pipelines", "list"], ["prune", "--dry-run", "--older-than", "30d"],
                                     ["spend-cap", "list"]])
@pytest.mark.parametrize("as_json_too", [False, True], ids=["text", "json"])
def test_a_deployment_no_pipeline_has_is_noted_not_shown_as_nothing_there(command, as_json_too, cli, store):
    """A new user's trial: a mistyped --deployment printed an empty status, or "would delete 0", exit 0, like a
    deployment with nothing to show. It still exits 0 (a deployment whose pipelines were all pruned has none),
    with a note on stderr; stdout stays the command's own (JSON with --json)."""
    store.pipelines.create_pipeline("job", ["a"], owner="r-blue", origin_run_id="r-blue", deployment="blue")
    result = cli(*command, "--deployment", "bleu", *(["--json"] if as_json_too else []))
    assert result.exit_code == 0
    assert "note: no pipeline of deployment 'bleu' is known" in result.stderr, result.stderr
    assert "no pipeline of deployment" not in result.stdout
    if as_json_too:
        json.loads(result.stdout)


# -- a rejected call writes nothing; every bad argument is one clear line ----------------------------------------

@pytest.mark.parametrize("command", [["status"], ["pipelines", "list"], ["events"], ["recover"],
                                     ["reset-stuck", "--dry-run"]])
def test_a_missing_sqlite_file_is_a_clear_error_and_is_not_created(command, tmp_path):
    typo = tmp_path / "recovery.sqlite3x"
    result = CliRunner().invoke(main, ["--database-url", f"sqlite:///{typo}", *command])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"Error: no SQLite database at {typo} (check --database-url, or create it with `recovery-ext migrate`)"]
    assert not typo.exists() and list(tmp_path.iterdir()) == []
    assert CliRunner().invoke(main, ["--database-url", f"sqlite:///{typo}", "migrate"]).exit_code == 0
    assert typo.is_file()


@pytest.mark.parametrize("args,text", [
    (["redo-degraded", "9223372036854775808"], "is not in the range"),
    (["--database-url", "postgresql://u:pw@" + "h" * 300 + "/db", "status"], "not a valid host name"),
    (["--database-url", "mysql://x@localhost/db", "status"], "unsupported database"),
    (["events", *[f"--kind=k{i}" for i in range(1500)]], "at most 1000 different --kind values"),
])
def test_bad_arguments_exit_2_with_one_clear_line(args, text, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    CliRunner().invoke(main, ["--database-url", url, "migrate"])
    result = CliRunner().invoke(main, ["--database-url", url, *args])
    assert result.exit_code == 2 and text in result.output, result.output
    assert "Traceback" not in result.output and "pw@" not in result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error:")] == [
        result.output.strip().splitlines()[-1]]


@pytest.mark.parametrize("cost", ["nan", "NaN", "inf", "-inf", "1e400", "-1", "1e13", "lots"])
def test_a_spend_cap_cost_that_is_not_a_finite_amount_exits_2(cli, store, cost):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    result = cli("spend-cap", "set", "--pipeline", str(own.pipeline_id), "--cost", cost, code=2)
    assert "Invalid value for '--cost'" in result.output and "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error:")] == [
        result.output.strip().splitlines()[-1]]
    # a finite amount gets past the arguments to the store, which makes the pipeline's first cap
    made = as_json(cli("spend-cap", "set", "--pipeline", str(own.pipeline_id), "--cost", "2.5", "--json"))
    assert (made["scope"], made["max_cost"], made["max_tokens"]) == (f"pipeline:{own.pipeline_id}", 2.5, None)


@pytest.mark.parametrize("target, says", [(["--pipeline", "999999"], "no pipeline 999999"),
                                          (["--deployment", "nowhere"], "no deployment 'nowhere'")])
def test_spend_cap_set_on_what_does_not_exist_is_one_clear_line(cli, store, target, says):
    store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    result = cli("spend-cap", "set", *target, "--tokens", "5", code=1)  # a not-found, as `pipelines show 999999`
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {says}"), result.output
    assert "Traceback" not in result.output and "no spend caps" in cli("spend-cap", "list").output


def test_an_unreachable_database_is_one_error_line_not_a_warning_per_retry(caplog):
    import logging
    import socket

    caplog.set_level(logging.WARNING)  # what a plain `recovery-ext` process would print to stderr

    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(main, ["--database-url", f"postgresql://postgres:pw-secret@127.0.0.1:{port}/x",
                                       "status"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: cannot reach the database at postgresql+psycopg://postgres:***@127.0.0.1:{port}/x")
    assert "pw-secret" not in result.output
    assert [r.getMessage() for r in caplog.records if r.name.startswith("recovery_ext")] == []


def test_many_kind_flags_on_postgresql_are_one_query_not_an_outage(cli, db_url):
    result = cli("events", *["--kind=pipeline_recovered"] * 70_000, "--json")
    assert result.exit_code == 0


def test_a_psycopg2_url_is_accepted_as_psycopg_3(pg_url):
    url = pg_url.replace("postgresql://", "postgresql+psycopg2://")
    assert CliRunner().invoke(main, ["--database-url", url, "migrate"]).exit_code == 0
    result = CliRunner().invoke(main, ["--database-url", url, "status", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["pipelines"] == []


def test_prune_says_its_age_in_human_units(cli):
    """`--older-than 90d` was echoed as "129600.0 min"."""
    assert "finished more than 90 days ago" in cli("prune", "--older-than", "90d", "--dry-run").output
    assert "finished more than 12 h ago" in cli("prune", "--older-than", "12h", "--dry-run").output
    assert "finished more than 1 day ago" in cli("prune", "--older-than", "1d", "--dry-run").output


def test_a_postgresql_database_whose_text_is_not_utf8_is_refused_clearly_before_anything_is_written():
    """A LATIN1 database takes ASCII keys and then fails the checkpoint of a key it has no code for, after the work
    was paid for: it is refused on connecting, by the store and by the CLI, in one line with the way out."""
    import uuid

    import psycopg

    from databases import PG_ADMIN_URL, drop_pg_database, pg_conninfo
    from recovery_ext._errors import ConfigurationError
    from recovery_ext._store.store import RecoveryStore

    name = f"rx_test_latin1_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_conninfo(PG_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
    url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}".replace("postgresql://", "postgresql+psycopg://")
    try:
        store = RecoveryStore(url, retry_budget=0)
        try:
            with pytest.raises(ConfigurationError, match=f"database '{name}' stores text as LATIN1, and recovery-ext "
                                                         "needs UTF-8"):
                store.migrate()
        finally:
            store.close()
        result = CliRunner().invoke(main, ["--database-url", url, "migrate"])
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert result.output.strip().splitlines() == [
            f"Error: database '{name}' stores text as LATIN1, and recovery-ext needs UTF-8 (item keys, results and "
            "errors may hold any character): use a database made with CREATE DATABASE ... ENCODING 'UTF8' "
            "TEMPLATE template0"]
        with psycopg.connect(pg_conninfo(url)) as conn:  # nothing was written: not even the migrations' table
            assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
    finally:
        drop_pg_database(PG_ADMIN_URL, url)


def test_a_command_that_follows_keeps_the_store_retry_warnings(caplog):
    """`events --follow` runs until stopped: the warning for each retried store call is the trace of a flapping
    database there, so it is kept (a one-shot command prints its outcome alone)."""
    import logging
    import socket

    caplog.set_level(logging.WARNING)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(main, ["--database-url", f"postgresql://postgres:pw-secret@127.0.0.1:{port}/x",
                                       "events", "--follow"])
    assert result.exit_code == 1 and "cannot reach the database" in result.output
    retries = [r.getMessage() for r in caplog.records if r.name == "recovery_ext._store.store.retries"]
    assert retries and all("failed (attempt" in line and "pw-secret" not in line for line in retries)
