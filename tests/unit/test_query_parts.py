"""The checkpoint statements share their fence, ledger and end as files of their own (``\\ir part.sql``).

What reaches the server is one statement with every part in place, and an include that names anything but a
file of the same folder is refused with a clear error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery_ext._errors import MigrationError
from recovery_ext._store import migrations
from recovery_ext._store.migrations import load_query

PARTS = {
    "checkpoint_items": ["_checkpoint_fence", "_checkpoint_items", "_checkpoint_calls", "_checkpoint_tail"],
    "checkpoint_new_items": ["_checkpoint_fence", "_checkpoint_items", "_checkpoint_new_written", "_checkpoint_calls",
                             "_checkpoint_tail"],
    "checkpoint_new_items_no_calls": ["_checkpoint_fence", "_checkpoint_items", "_checkpoint_new_written",
                                      "_checkpoint_tail"],
}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_a_checkpoint_statement_has_each_shared_part_in_place(name):
    statement = load_query("postgres", name)
    assert "\\ir" not in statement and "--" not in statement
    for part in PARTS[name]:
        assert load_query("postgres", part) in statement
    assert statement.startswith("WITH fence AS (") and statement.endswith("END AS written")
    assert ("jsonb_to_recordset(%(calls)s" in statement) == ("_checkpoint_calls" in PARTS[name])


def test_the_single_item_statement_fences_as_the_shared_fence_does():
    """checkpoint_new_item.sql is one INSERT ... SELECT without CTEs, so it cannot include the fence: it
    repeats the fence's row, condition and lock, and this keeps the two the same."""
    fence = " ".join(load_query("postgres", "_checkpoint_fence").split())
    single = " ".join(load_query("postgres", "checkpoint_new_item").split())
    condition = "WHERE id = %(pipeline)s AND epoch = %(epoch)s AND status = 'running' FOR KEY SHARE"
    assert f"FROM rx_pipelines {condition}" in fence
    assert single.startswith("INSERT INTO rx_node_items") and single.endswith(f"FROM rx_pipelines {condition}")
    assert "WITH" not in single and "--" not in single


def test_the_plain_batch_statement_is_the_shared_fence_and_one_insert():
    """checkpoint_new_items_plain.sql (new items without calls or a stall push) includes the shared fence and
    items, then inserts from them: no ledger arrays, no RETURNING, so the store reads its row count."""
    shared = load_query("postgres", "_checkpoint_fence") + "\n" + load_query("postgres", "_checkpoint_items")
    plain = load_query("postgres", "checkpoint_new_items_plain")
    assert plain.startswith(shared) and "\\ir" not in plain and "--" not in plain
    rest = " ".join(plain[len(shared):].split())
    assert rest.startswith("INSERT INTO rx_node_items") and rest.endswith("FROM fence, items")
    assert "%(calls)s" not in rest and "RETURNING" not in rest and "stall" not in rest


def test_the_single_item_stall_statement_is_the_shared_fence_and_stall_push_then_one_insert():
    """checkpoint_new_item_stall.sql (one new item without calls, on a node with a stall timeout) includes the
    shared fence and stall push, then inserts its scalars from the fence: no arrays, no final SELECT, so the store
    reads its row count (0: superseded), as it does the one-item statement's."""
    shared = load_query("postgres", "_checkpoint_fence") + "\n" + load_query("postgres", "_checkpoint_progress")
    single = load_query("postgres", "checkpoint_new_item_stall")
    assert single.startswith(shared) and "\\ir" not in single and "--" not in single
    assert load_query("postgres", "_checkpoint_progress") in load_query("postgres", "checkpoint_new_items_no_calls")
    rest = " ".join(single[len(shared):].split())
    assert rest.startswith("INSERT INTO rx_node_items") and rest.endswith("FROM fence")
    assert "%(key)s" in rest and "%(keys)s" not in single and "RETURNING" not in rest


@pytest.fixture
def query_folder(tmp_path, monkeypatch):
    """A folder of queries of its own (``sql/test_includes/queries``), read afresh."""
    queries = tmp_path / "test_includes" / "queries"
    queries.mkdir(parents=True)
    monkeypatch.setattr(migrations, "_sql_root", lambda package=migrations.LIBRARY: Path(tmp_path))
    load_query.cache_clear()
    yield queries
    load_query.cache_clear()


@pytest.mark.parametrize("line", ["\\ir ../postgres/0001_initial.sql", "\\ir ..\\postgres\\x.sql",
                                  "\\ir\t../x.sql", "\\ir _checkpoint_fence", "\\ir a.sql b.sql", "\\ir"])
def test_an_include_of_anything_but_one_file_of_the_same_folder_is_refused(query_folder, line):
    (query_folder / "bad.sql").write_text(f"-- an include out of its folder\n{line}\nSELECT 1\n")
    with pytest.raises(MigrationError, match="ir takes one file of the same folder"):
        load_query("test_includes", "bad")


def test_an_include_that_leads_back_to_itself_is_refused(query_folder):
    (query_folder / "first.sql").write_text("SELECT 1\n\\ir second.sql\n")
    (query_folder / "second.sql").write_text("-- a part\n\\ir first.sql\n")
    with pytest.raises(MigrationError, match=r"first.sql includes itself \(first -> second -> first.sql\)"):
        load_query("test_includes", "first")


def test_an_include_is_expanded_in_place_with_its_own_comments_gone(query_folder):
    (query_folder / "whole.sql").write_text("-- the whole\nSELECT a\n\\ir part.sql\nFROM t\n")
    (query_folder / "part.sql").write_text("-- the part\n, b\n")
    assert load_query("test_includes", "whole") == "SELECT a\n, b\nFROM t"
