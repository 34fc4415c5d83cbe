"""No secret anywhere: planted passwords (source DB, application DB) and an API key never reach a table,
the Dagster storage folder (run config snapshots, event logs, IO-manager pickles, compute logs) or the CLI."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance
from sqlalchemy import MetaData, select

from databases import create_pg_database, drop_pg_database
from recovery_ext._cli import main
from recovery_ext import execute_in_process
from recovery_pipelines.sample_data import create_sample_database
from recovery_ext._store.store import RecoveryStore

SOURCE_PASSWORD = "PlantedSourcePw-7f3a9c"
APP_PASSWORD = "PlantedAppPw-b81d44"
API_KEY = "sk-PlantedApiKey0123456789abcdef"
SECRETS = (SOURCE_PASSWORD, APP_PASSWORD, API_KEY)


def with_password(url: str, password: str) -> str:  # trust auth accepts any password: it is only planted
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@")


def with_port_typo(url: str) -> str:
    """``url`` with its port mistyped (``54x2``), whatever port the test server listens on (RECOVERY_TEST_PG)."""
    parts = urlsplit(url)
    port = str(parts.port or 5432)
    netloc = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
    typo = urlunsplit(parts._replace(netloc=f"{netloc}:{port[:2]}x{port[3:]}"))
    assert typo != url and parts.hostname in typo
    return typo


@pytest.fixture
def source_db(pg_admin):
    url = create_pg_database(pg_admin)
    create_sample_database(url.replace("postgresql://", "postgresql+psycopg://"))
    yield url
    drop_pg_database(pg_admin, url)


def every_table_as_text(url: str) -> str:
    store = RecoveryStore(url)
    meta = MetaData()
    meta.reflect(store.engine)
    with store.engine.connect() as conn:
        text = "\n".join(repr(conn.execute(select(t)).all()) for t in meta.tables.values())
    store.close()
    return text


def files_containing(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("url,typo", [
    ("postgresql://postgres:pw@127.0.0.1:5432/db", "postgresql://postgres:pw@127.0.0.1:54x2/db"),
    ("postgresql://postgres@127.0.0.1:6543/db", "postgresql://postgres@127.0.0.1:65x3/db"),
    ("postgresql://postgres@localhost/db", "postgresql://postgres@localhost:54x2/db"),
])
def test_the_port_typo_is_made_whatever_the_test_server_s_port(url, typo):
    assert with_port_typo(url) == typo


@pytest.mark.parametrize("port_typo", [False, True], ids=["valid-url", "port-typo"])
def test_planted_passwords_and_api_key_appear_nowhere(port_typo, source_db, pg_url, tmp_path, monkeypatch, caplog,
                                                      capfd):
    app_url = with_password(pg_url, APP_PASSWORD)
    source_url = with_password(source_db, SOURCE_PASSWORD)
    if port_typo:
        source_url = with_port_typo(source_url)
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("RECOVERY_DATABASE_URL", app_url)
    monkeypatch.setenv("RECOVERY_SOURCE_URL", source_url)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    caplog.set_level(logging.DEBUG)
    from recovery_pipelines.assembly import build_definitions

    defs = build_definitions()
    with DagsterInstance.local_temp(str(home)) as instance:
        result = execute_in_process(defs.get_job_def("ontology_extraction"), instance=instance, raise_on_error=False)
    assert result.success == (not port_typo)
    store = RecoveryStore(app_url)
    (p,) = store.reports.list_pipelines()
    cli_output = "".join(CliRunner().invoke(main, ["--database-url", app_url, *args]).output for args in (
        ["status"], ["pipelines", "list"], ["pipelines", "show", str(p.id)], ["pipelines", "show", str(p.id),
                                                                                "--json"], ["events", "--json"]))
    cli_output += CliRunner().invoke(main, ["--database-url", with_port_typo(app_url), "status"]).output
    store.close()
    captured = capfd.readouterr()
    logs = caplog.text + captured.out + captured.err
    for secret in SECRETS:
        assert secret not in every_table_as_text(pg_url), secret
        assert files_containing(home, secret) == [], secret
        assert secret not in logs, secret
        assert secret not in cli_output, secret
    if port_typo:
        assert "postgres:***@" in logs  # the error names the URL, redacted


# -- one redaction for every URL-like value ------------------------------------------------------------------------

@pytest.mark.parametrize("url,shown", [
    ("http://user:PW-1@host/v1", "http://user:***@host/v1"),
    ("postgresql://u@h/db?sslpassword=PW-1&sslmode=require", "postgresql://u@h/db?sslpassword=***&sslmode=require"),
    ("postgresql://u@h/db?password=PW-1", "postgresql://u@h/db?password=***"),
    ("https://api.example.com/v1?api_key=PW-1&apikey=PW-1&x=1", "https://api.example.com/v1?api_key=***&apikey=***&x=1"),
    ("https://h/v1?token=PW-1&access_token=PW-1&client_secret=PW-1&secret=PW-1",
     "https://h/v1?token=***&access_token=***&client_secret=***&secret=***"),
    ("https://h/v1?sig=PW-1&max_tokens=10", "https://h/v1?sig=***&max_tokens=10"),
])
def test_redact_url_masks_userinfo_and_password_like_parameters(url, shown):
    from sqlalchemy.engine import make_url

    from recovery_ext import redact, redact_url

    assert redact_url(url) == shown
    assert "PW-1" not in redact(f"error talking to {url}: refused")  # inside a message too
    if url.startswith("postgresql"):
        from_object = redact_url(make_url(url))  # a SQLAlchemy URL object (it sorts the query)
        assert "PW-1" not in from_object and sorted(from_object.split("?")[1].split("&")) == sorted(
            shown.split("?")[1].split("&"))


def test_run_config_secrets_are_masked_in_params_and_the_resume_gets_the_real_config(store):
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test, instance_for_test

    from recovery_ext._dagster.resume_runs import resume_request
    from recovery_ext._store.models import Reclaimed

    config = {"resources": {"llm": {"config": {"api_key": API_KEY, "model": "m",
                                               "base_url": f"http://u:{APP_PASSWORD}@h/v1"}}},
              "ops": {"a": {"config": {"client_secret": "cs-" + SOURCE_PASSWORD, "limit": 3}}}}
    own = store.pipelines.create_pipeline("job", ["a"], owner="r1", origin_run_id="r1", params=config)
    stored = store.pipelines.get_pipeline(own.pipeline_id).params
    assert stored["resources"]["llm"]["config"] == {"api_key": "***", "model": "m", "base_url": "http://u:***@h/v1"}
    assert stored["ops"]["a"]["config"] == {"client_secret": "***", "limit": 3}
    with instance_for_test() as instance:
        origin = create_run_for_test(instance, job_name="job", run_config=config, status=DagsterRunStatus.FAILURE)
        request = resume_request(Reclaimed(own.pipeline_id, "job", stored, "r1", "resume-1-1", 2, 1,
                                           origin_run_id=origin.run_id), origin)
    assert request.run_config == config  # the first run's own config, secrets and all, from Dagster


def test_provider_endpoint_credentials_never_reach_the_breaker_key_or_the_enricher_name(store):
    from recovery_ext import ProviderGuard, RetryPolicy
    from recovery_pipelines.llm import LLMResource

    url = f"http://user:{APP_PASSWORD}@127.0.0.1:9/v1?api_key={API_KEY}"
    from recovery_ext._errors import RecoveryError
    from recovery_ext._providers.guard import OutageSettings

    guard = ProviderGuard(url, store=store, policy=RetryPolicy(), settings=OutageSettings(budget_seconds=1.0),
                          sleep=lambda _s: None, clock=iter(range(0, 10**6, 5)).__next__)  # the budget ends at once
    with pytest.raises((ConnectionError, RecoveryError)):
        guard.call(lambda: (_ for _ in ()).throw(ConnectionRefusedError("refused")))
    text = every_table_as_text(store.url.render_as_string(hide_password=False))
    assert "user:***@127.0.0.1:9/v1?api_key=***" in text
    enricher = LLMResource(base_url=url, api_key=API_KEY).enricher()
    for secret in (APP_PASSWORD, API_KEY):
        assert secret not in text and secret not in enricher.name and secret not in repr(enricher.policy.context)


def test_llm_url_credentials_source_query_password_and_run_config_api_key_appear_nowhere(
        source_db, pg_url, tmp_path, monkeypatch, caplog, capfd):
    from recovery_pipelines.demo_llm import serve

    server, llm_url = serve(latency=0.0)
    llm_url = llm_url.replace("http://", f"http://llmuser:{APP_PASSWORD}@")
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("RECOVERY_DATABASE_URL", pg_url)
    monkeypatch.setenv("RECOVERY_SOURCE_URL", f"{source_db}?password={SOURCE_PASSWORD}")
    monkeypatch.setenv("RECOVERY_LLM_BASE_URL", llm_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    caplog.set_level(logging.DEBUG)
    from recovery_pipelines.assembly import build_definitions

    try:
        defs = build_definitions()
        with DagsterInstance.local_temp(str(home)) as instance:
            result = execute_in_process(defs.get_job_def("ontology_extraction"), instance=instance,
                                        run_config={"resources": {"llm": {"config": {"api_key": API_KEY,
                                                                                         "base_url": llm_url}}}})
            assert result.success
            llm_metadata = [str(e.event_specific_data) for e in result.all_events
                            if "openai-compatible" in str(e.event_specific_data)]
    finally:
        server.shutdown()
    assert llm_metadata and all("llmuser:***@" in m for m in llm_metadata)
    tables = every_table_as_text(pg_url)
    assert "llmuser:***@127.0.0.1" in tables  # described_by names the endpoint, redacted
    store = RecoveryStore(pg_url)
    (p,) = store.reports.list_pipelines()
    store.close()
    runner = CliRunner()
    cli_output = "".join(runner.invoke(main, ["--database-url", pg_url, *args]).output for args in (
        ["status"], ["pipelines", "list", "--json"], ["pipelines", "show", str(p.id), "--json"], ["events", "--json"]))
    captured = capfd.readouterr()
    logs = caplog.text + captured.out + captured.err
    for secret in SECRETS:
        assert secret not in tables, secret
        # Dagster keeps the run config it was given in its run storage (runs.db); nowhere else: not the event log
        assert [f for f in files_containing(home, secret) if not f.endswith("runs.db")] == [], secret
        assert secret not in logs, secret
        assert secret not in cli_output, secret


def test_demo_setup_never_prints_a_password_given_as_a_query_parameter(pg_url, tmp_path):
    url = f"{pg_url}?sslpassword={APP_PASSWORD}"
    result = CliRunner().invoke(main, ["--database-url", url, "demo", "setup", "--folder", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert "sslpassword=***" in result.output and APP_PASSWORD not in result.output


def test_the_shared_rate_budget_is_keyed_by_the_redacted_endpoint(store):
    from recovery_ext import ProviderLimits
    from recovery_ext._providers.budget import RateBudget

    budget = RateBudget(store, f"http://user:{APP_PASSWORD}@127.0.0.1:9/v1?api_key={API_KEY}",
                        ProviderLimits(requests_per_minute=10))
    assert budget.endpoint == "http://user:***@127.0.0.1:9/v1?api_key=***"


@pytest.mark.parametrize("resource, secret", [
    ("recovery", "pw-in-the-url"),
    ("llm", "sk-planted-api-key"),
])
def test_a_refused_setting_does_not_show_the_secrets_given_beside_it(resource, secret):
    """pydantic's error quotes the input it refused (the start and the end of all the fields given): a URL's
    password or an API key given last showed in it. The refusal names the setting, never the input."""
    from recovery_ext import LLMResource, RecoveryResource

    with pytest.raises(ValueError) as refused:
        if resource == "recovery":
            RecoveryResource(heartbeat_timeout=-1, database_url=f"postgresql://u:{secret}@h/d")
        else:
            LLMResource(timeout=-1, api_key=secret)
    assert secret not in str(refused.value) and "timeout" in str(refused.value)
