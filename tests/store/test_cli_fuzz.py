"""Fuzzed CLI arguments: never a traceback, a clear exit status, and a rejected command changes nothing."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import MetaData, inspect, select

from recovery_ext._cli import main
from recovery_ext._store.store import RecoveryStore

COMMANDS = [["status"], ["pipelines", "list"], ["pipelines", "show"], ["recover"], ["reset-stuck"],
            ["retry-dead"], ["events"], ["migrate", "--print"], ["demo", "setup", "--folder"]]
OPTIONS = ["--threshold", "--limit", "--job-id", "--queue", "--dry-run", "--all", "--kind", "--interval", "--status",
           "--json"]
NASTY = ["0", "-1", "1", "2", "3", str(2**63), str(2**63 - 1), str(10**30), "nan", "inf", "-inf", "1e308", "1e-9",
         "10m", "1d", "999999d", "", " ", "ocr", "☃", "%s", "'; DROP TABLE rx_events; --", "/proc/x",
         "postgresql+nodriver://u:pw@h/db", "postgresql://u:pw@h:54x2/db", "mysql://x@y/z", "\x00"]
token = st.one_of(st.sampled_from(OPTIONS + NASTY), st.integers(min_value=-(2**70), max_value=2**70).map(str),
                  st.text(max_size=8))


_reflected: dict[tuple[str, tuple[str, ...]], MetaData] = {}


def snapshot(store: RecoveryStore) -> dict[str, list]:
    """Every row of every table. The tables are reflected again only when their names change (reflecting
    them is most of the cost of a fuzzed call); a table a command added or dropped changes the names."""
    names = tuple(sorted(inspect(store.engine).get_table_names()))
    key = (str(store.engine.url), names)
    if key not in _reflected:
        _reflected[key] = MetaData()
        _reflected[key].reflect(store.engine)
    with store.engine.connect() as conn:
        return {name: sorted(map(tuple, conn.execute(select(table)).all()), key=repr)
                for name, table in _reflected[key].tables.items()}


def seeded_store(tmp_path_factory) -> tuple[str, RecoveryStore]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'r.sqlite3'}"
    store = RecoveryStore(url)
    store.migrate()
    store.queue.enqueue("ocr", [{"n": i} for i in range(4)], max_attempts=1)
    for item in store.queue.claim("ocr", "w", limit=2):
        store.queue.fail_item(item, "boom")
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner="run-1")
    store.pipelines.start_node(own, "a")
    store.record_event("item_dead", {"queue": "ocr"})
    return url, store


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory):
    url, store = seeded_store(tmp_path_factory)
    yield url, store
    store.close()


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(command=st.sampled_from(COMMANDS), args=st.lists(token, max_size=5))
def test_fuzzed_arguments_never_give_a_traceback_or_a_partial_write(fuzz_store, command, args):
    url, store = fuzz_store
    before = snapshot(store)
    runner = CliRunner()
    with runner.isolated_filesystem():  # `demo setup --folder <fuzz>` must write into a throw-away directory
        result = runner.invoke(main, ["--database-url", url, *command, *args])
    assert result.exit_code in (0, 1, 2), (command, args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        command, args, repr(result.exception))
    assert "Traceback" not in result.output
    # a folder the user named is shown as its path, whatever it looks like; any other URL-ish token is masked
    named_folder = command == ["demo", "setup", "--folder"] and args and "pw@" in args[0]
    assert named_folder or "pw@" not in result.output, (command, args, result.output)
    if result.exit_code != 0:
        assert snapshot(store) == before, (command, args, result.output)


def test_retry_dead_with_one_unknown_id_changes_nothing(tmp_path_factory):
    url, store = seeded_store(tmp_path_factory)
    dead = [i.id for i in store.queue.list_items("ocr", status="dead")]
    before = snapshot(store)
    result = CliRunner().invoke(main, ["--database-url", url, "retry-dead", str(dead[0]), "99999"])
    assert result.exit_code == 1 and "nothing was changed" in result.output
    assert snapshot(store) == before
    store.close()


@pytest.mark.parametrize("command", [["demo", "setup", "--folder"], ["demo", "add-documents", "1", "--folder"]])
def test_a_nul_byte_in_a_folder_is_a_usage_error(command, tmp_path):
    result = CliRunner().invoke(main, ["--database-url", f"sqlite:///{tmp_path / 'r.sqlite3'}", *command, "a\x00b"])
    assert result.exit_code == 2 and "cannot contain a NUL byte" in result.output
    assert isinstance(result.exception, SystemExit) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["status"], ["pipelines", "list"], ["prune", "--older-than", "90d"]])
@pytest.mark.parametrize("name", ["", "a b", "a\x00b", "-x", "x" * 65])
def test_a_deployment_no_deployment_can_be_named_is_a_usage_error(fuzz_store, command, name):
    """A new user's trial: `prune --deployment ""` (or a NUL, or a space) matched nothing and said it pruned 0,
    while `spend-cap set --deployment ""` refused the same name."""
    url, store = fuzz_store
    result = CliRunner().invoke(main, ["--database-url", url, *command, "--deployment", name])
    assert result.exit_code == 2 and "--deployment must be 1 to 64 letters" in result.output, result.output


@pytest.mark.parametrize("args", [["prune", "--older-than", "\uff19\uff10d"], ["status", "--threshold", "\uff16\uff10"],
                                  ["spend-cap", "set", "--deployment", "d", "--tokens", "\uff11\uff12"],
                                  ["spend-cap", "set", "--deployment", "d", "--cost", "\uff11\uff12"],
                                  ["pipelines", "show", "\uff11"], ["pipelines", "list", "--limit", "\uff15"]])
def test_digits_of_other_scripts_are_not_a_number(fuzz_store, args):
    """float() reads "９０" as 90: an operator typed no such thing, so it is refused as any other non-number."""
    url, store = fuzz_store
    before = snapshot(store)
    result = CliRunner().invoke(main, ["--database-url", url, *args])
    assert result.exit_code == 2, result.output
    assert snapshot(store) == before
