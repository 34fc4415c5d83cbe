"""The store's shape as its callers see it: statuses are enums, not bare strings; each caller sees a narrow
interface of the store (a Protocol) and calls nothing else."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import recovery_ext
from recovery_ext._store import interfaces, schema, statuses
from recovery_ext._store.interfaces import CliStore, LivenessStore, OpStore, ProviderStore, QueueStore, SensorStore
from recovery_ext._store.statuses import BreakerState, ItemStatus, NodeStatus, PipelineStatus, QueueStatus

LIBRARY = Path(recovery_ext.__file__).resolve().parent
ENUMS = (PipelineStatus, NodeStatus, ItemStatus, QueueStatus, BreakerState)
STATUS_VALUES = {member.value for enum in ENUMS for member in enum} | {statuses.WAITING}
# Modules that spell statuses on purpose: the enums' own module, and the report's own vocabulary of how a
# run ended and what an interval was (crashed, superseded, never started, waiting, running), which shares
# some words with the statuses but is not one of them.
SPELLS_STATUSES = {LIBRARY / "_store" / "statuses.py", LIBRARY / "_observe" / "timeline.py",
                   LIBRARY / "_observe" / "report.py"}
# Modules being rewritten elsewhere when the enums landed; each moves to the enums when it next changes.
NOT_YET_CONVERTED: set[Path] = set()


def bare_status_literals(path: Path) -> list[str]:
    """``line: 'value'`` for each string constant in ``path`` that is exactly a status value. Not counted:
    parts of f-strings (messages) and mapping keys (``{"failed": count}``, ``data["waiting"]``: names of
    fields, not statuses)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            exempt.update(id(part) for part in ast.walk(node))
        elif isinstance(node, ast.Dict):
            exempt.update(id(key) for key in node.keys if key is not None)
        elif isinstance(node, ast.Subscript):
            exempt.add(id(node.slice))
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STATUS_VALUES
            and id(node) not in exempt]


def test_no_library_module_spells_a_status_as_a_bare_string():
    found = {str(path.relative_to(LIBRARY)): hits for path in sorted(LIBRARY.rglob("*.py"))
             if path not in SPELLS_STATUSES | NOT_YET_CONVERTED and (hits := bare_status_literals(path))}
    assert found == {}


def test_the_check_finds_a_bare_status(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('x = {"failed": 1}\nif status == "running":\n    y = f"running {x}"\nz = ("dead",)\n')
    assert bare_status_literals(sample) == ["2: 'running'", "4: 'dead'"]


def test_the_enums_hold_exactly_the_values_the_columns_held():
    """The database keeps the same strings: the enums renamed nothing."""
    assert schema.PIPELINE_STATUSES == ("pending", "running", "completed", "failed", "canceled")
    assert schema.NODE_STATUSES == ("pending", "running", "completed", "failed", "degraded", "skipped")
    assert schema.ITEM_STATUSES == ("completed", "degraded")
    assert schema.QUEUE_STATUSES == ("ready", "processing", "completed", "failed", "dead")
    assert schema.BREAKER_STATES == ("closed", "open", "half_open")
    assert statuses.WAITING == "waiting"


@pytest.mark.parametrize("enum", ENUMS + (statuses.ItemOutcome,), ids=lambda e: e.__name__)
def test_the_enums_are_public_and_their_members_are_their_strings(enum):
    assert getattr(recovery_ext, enum.__name__) is enum
    for member in enum:
        assert member == member.value and str(member) == member.value and f"{member}" == member.value


def test_a_status_written_as_an_enum_reads_back_as_its_string(store):
    own = store.create_pipeline("shape", ["a"], owner="run-1")
    store.start_node(own, "a")
    store.checkpoint_items(own, "a", [recovery_ext._store.models.ItemCheckpoint("k", 1, ItemStatus.DEGRADED)])
    pipeline, node = store.get_pipeline(own.pipeline_id), store.get_node(own.pipeline_id, "a")
    assert (type(pipeline.status), pipeline.status) == (str, "running")
    assert (type(node.status), node.status) == (str, "running")
    assert store.start_items(own, "a", 1) == {"k": "degraded"}


# Each module that calls the store, and the interface it is given.
CALLERS = {
    "_dagster/context.py": OpStore,
    "_dagster/recoverable.py": OpStore,
    "_dagster/executor.py": OpStore,
    "_dagster/replay.py": OpStore,
    "_dagster/providers.py": OpStore,
    "_dagster/provider_jobs.py": OpStore,
    "_dagster/assets.py": OpStore,
    "_dagster/queue_handle.py": QueueStore,
    "_liveness/heartbeat.py": LivenessStore,
    "_liveness/watch.py": LivenessStore,
    "_providers/guard.py": ProviderStore,
    "_providers/budget.py": ProviderStore,
    "_providers/ledger.py": ProviderStore,
    "_providers/journal.py": ProviderStore,
    "_dagster/sensors.py": SensorStore,
    "_recovery/protocol.py": SensorStore,
    "_recovery/scan.py": SensorStore,
    "_recovery/retention.py": SensorStore,
    "_cli.py": CliStore,
    "_observe/exporter.py": CliStore,
}
# Builds the store (migrations, pool, retry budget) and hands it out: it holds the whole RecoveryStore.
OWNERS = {"_dagster/resources.py"}
PROTOCOLS = (LivenessStore, ProviderStore, QueueStore, OpStore, SensorStore, CliStore)
STORE_NAMES = {"store", "_store", "_queue_store"}


def store_members_used(path: Path) -> set[str]:
    """Every attribute a module reads off a store: ``store.x``, ``self._store.x``, ``scope.store.x``..."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if ((isinstance(owner, ast.Name) and owner.id in STORE_NAMES)
                    or (isinstance(owner, ast.Attribute) and owner.attr in STORE_NAMES)):
                used.add(node.attr)
    return used


def protocol_members(protocol: type) -> set[str]:
    return {name for klass in protocol.__mro__ if klass.__module__ == interfaces.__name__
            for name in list(vars(klass)) + list(getattr(klass, "__annotations__", {}))
            if not name.startswith("_")}


@pytest.mark.parametrize("module", sorted(CALLERS))
def test_each_caller_uses_only_the_store_members_its_interface_lists(module):
    path = LIBRARY / module
    assert path.is_file()
    outside = store_members_used(path) - protocol_members(CALLERS[module])
    assert outside == set(), f"{module} calls store members its {CALLERS[module].__name__} does not list"


def test_every_module_that_calls_the_store_has_an_interface():
    callers = {str(path.relative_to(LIBRARY)) for path in LIBRARY.rglob("*.py")
               if path.parent.name != "_store" and store_members_used(path)}
    assert callers - set(CALLERS) - OWNERS == set()


def test_the_caller_check_sees_store_calls_however_the_store_is_reached(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("store.a()\nself._store.b\nscope.store.c(1)\nself._queue_store.d()\nstored.e()\n")
    assert store_members_used(sample) == {"a", "b", "c", "d"}


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_the_store_satisfies_each_interface_with_the_same_signatures(store, protocol):
    assert isinstance(store, protocol)
    for name in protocol_members(protocol):
        declared = getattr(protocol, name, None)
        if not callable(declared):
            assert hasattr(store, name)  # an attribute, such as the store's url
            continue
        wanted = [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(declared).parameters.values()]
        actual = [(p.name, p.kind, p.default is p.empty)
                  for p in inspect.signature(getattr(type(store), name)).parameters.values()]
        assert actual == wanted, f"{protocol.__name__}.{name} differs from RecoveryStore.{name}"
