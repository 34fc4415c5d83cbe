"""The store's shape as its callers see it: statuses are enums, not bare strings; each caller sees a narrow
interface of the store (a Protocol) and calls nothing else."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import sqlalchemy

import recovery_ext
import recovery_ext._store
import recovery_ext.store
from recovery_ext._store import interfaces, schema, statuses
from recovery_ext._store.database import Component, Database, Fence, Transactions
from recovery_ext._store.interfaces import (CliStore, GuardStore, LivenessStore, OpStore, PipelineStore, ProviderStore,
                                            QueueHandleStore, QueueStore, RecoveryPassStore, ReportStore, SensorStore)
from recovery_ext._store.ledger import LedgerWrites
from recovery_ext._store.pipelines import PipelineCore
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
    assert getattr(recovery_ext.store, enum.__name__) is enum
    for member in enum:
        assert member == member.value and str(member) == member.value and f"{member}" == member.value


def test_a_status_written_as_an_enum_reads_back_as_its_string(store):
    own = store.pipelines.create_pipeline("shape", ["a"], owner="run-1")
    store.pipelines.start_node(own, "a")
    store.pipelines.checkpoint_items(own, "a", [recovery_ext._store.models.ItemCheckpoint("k", 1, ItemStatus.DEGRADED)])
    pipeline, node = store.pipelines.get_pipeline(own.pipeline_id), store.pipelines.get_node(own.pipeline_id, "a")
    assert (type(pipeline.status), pipeline.status) == (str, "running")
    assert (type(node.status), node.status) == (str, "running")
    assert store.pipelines.start_items(own, "a", 1) == {"k": "degraded"}


# Each module that calls the store, and the view of the store it is given.
CALLERS = {
    "_dagster/context.py": OpStore,
    "_dagster/recoverable.py": OpStore,
    "_dagster/executor.py": OpStore,
    "_dagster/replay.py": OpStore,
    "_dagster/providers.py": OpStore,
    "_dagster/provider_jobs.py": OpStore,
    "_dagster/assets.py": OpStore,
    "_dagster/queue_handle.py": QueueHandleStore,
    "_liveness/heartbeat.py": LivenessStore,
    "_providers/guard.py": GuardStore,
    "_providers/budget.py": GuardStore,
    "_providers/spend.py": GuardStore,
    "_providers/ledger.py": GuardStore,
    "_providers/journal.py": GuardStore,
    "_dagster/sensors.py": SensorStore,
    "_recovery/protocol.py": SensorStore,
    "_cli.py": CliStore,
    "_cli_common.py": CliStore,
    "_cli_spend.py": CliStore,
    "_observe/exporter.py": CliStore,
}
# Builds the store (migrations, pool, retry budget) and hands it out: it holds the whole RecoveryStore.
OWNERS = {"_dagster/resources.py"}
VIEWS = (LivenessStore, GuardStore, QueueHandleStore, OpStore, SensorStore, CliStore)
# Each component of the store, and the one protocol it is.
COMPONENTS = {"pipelines": PipelineStore, "providers": ProviderStore, "queue": QueueStore,
              "recovery": RecoveryPassStore, "reports": ReportStore}
# What every component inherits (the transactions of the one Database): not part of any component's surface.
# The helpers they share (PipelineCore, LedgerWrites, Fence) are held, never inherited.
SHARED = (Component, Transactions, object)
# What RecoveryStore itself offers besides its components (documented in docs/reference/api.md): its lifecycle
# (the schema, closing, a read-only connection), and the database's identity and retry budget.
STORE_SURFACE = {"migrate", "check_schema", "pending_migrations", "close", "read_only", "url", "dialect", "engine",
                 "retry_budget", *COMPONENTS}
STORE_NAMES = {"store", "_store", "_queue_store"}


def is_store(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Name) and node.id in STORE_NAMES)
            or (isinstance(node, ast.Attribute) and node.attr in STORE_NAMES))


def store_members_used(path: Path) -> set[str]:
    """Every member a module reaches through a store: ``store.x`` and, through a component, ``store.queue.claim``
    as ``queue.claim`` (``self._store.x``, ``scope.store.x``... alike)."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            if is_store(node.value):
                if node.attr not in COMPONENTS:
                    used.add(node.attr)
            elif isinstance(node.value, ast.Attribute) and node.value.attr in COMPONENTS and is_store(node.value.value):
                used.add(f"{node.value.attr}.{node.attr}")
    return used


def protocol_members(protocol: type) -> set[str]:
    return {name for klass in protocol.__mro__ if klass.__module__ == interfaces.__name__
            for name in list(vars(klass)) + list(getattr(klass, "__annotations__", {}))
            if not name.startswith("_")}


def view_members(view: type) -> set[str]:
    """What a caller given ``view`` may use: its own members, and each component it names with that component's
    protocol (as ``component.method``)."""
    members = protocol_members(view)
    return {name for name in members if name not in COMPONENTS} | {
        f"{name}.{method}" for name in members & set(COMPONENTS) for method in protocol_members(COMPONENTS[name])
    }


def component_surface(component: object) -> set[str]:
    return {name for klass in type(component).__mro__ if klass not in SHARED for name in vars(klass)
            if not name.startswith("_")}


@pytest.mark.parametrize("module", sorted(CALLERS))
def test_each_caller_uses_only_the_store_members_its_view_lists(module):
    path = LIBRARY / module
    assert path.is_file()
    outside = store_members_used(path) - view_members(CALLERS[module])
    assert outside == set(), f"{module} calls store members its {CALLERS[module].__name__} does not list"


def test_every_module_that_calls_the_store_has_a_view():
    callers = {str(path.relative_to(LIBRARY)) for path in LIBRARY.rglob("*.py")
               if path.parent.name != "_store" and store_members_used(path)}
    assert callers - set(CALLERS) - OWNERS == set()


def test_the_caller_check_sees_store_calls_however_the_store_is_reached(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("store.a()\nself._store.queue.b\nscope.store.pipelines.c(1)\nself._queue_store.d()\n"
                      "stored.e()\nqueue.f()\n")
    assert store_members_used(sample) == {"a", "queue.b", "pipelines.c", "d"}


@pytest.mark.parametrize("view", VIEWS, ids=lambda p: p.__name__)
def test_the_store_satisfies_each_view(store, view):
    assert isinstance(store, view)
    for name in protocol_members(view) - set(COMPONENTS):
        assert hasattr(store, name)


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_each_component_is_exactly_its_protocol_with_the_same_signatures(store, name):
    component, protocol = getattr(store, name), COMPONENTS[name]
    assert isinstance(component, protocol)
    assert component_surface(component) == protocol_members(protocol)
    for member in protocol_members(protocol):
        wanted = [(p.name, p.kind, p.default is p.empty)
                  for p in inspect.signature(getattr(protocol, member)).parameters.values()]
        actual = [(p.name, p.kind, p.default is p.empty)
                  for p in inspect.signature(getattr(type(component), member)).parameters.values()]
        assert actual == wanted, f"{protocol.__name__}.{member} differs from store.{name}.{member}"


def test_no_method_belongs_to_two_components(store):
    surfaces = [component_surface(getattr(store, name)) for name in COMPONENTS]
    assert sum(map(len, surfaces)) == len(set().union(*surfaces))


def test_the_store_and_its_components_inherit_in_one_line(store):
    """No diamond: every class of the store and of each component has one base, and no component is built on
    another component (one that needs another would be handed it)."""
    for klass in [type(store), *(type(getattr(store, name)) for name in COMPONENTS)]:
        assert all(len(base.__bases__) <= 1 for base in klass.__mro__), klass
    component_types = {type(getattr(store, name)) for name in COMPONENTS}
    for klass in component_types:
        assert component_types & set(klass.__mro__[1:]) == set()
    assert {getattr(store, name)._db for name in COMPONENTS} == {store._db}  # one Database: one engine, one budget


# What a plain component may inherit: the transactions of the one Database.
INFRASTRUCTURE = "recovery_ext._store.database"


def foreign_bases(klass: type) -> list[str]:
    """The classes ``klass`` inherits (directly or further up) that another domain module of ``_store`` defines:
    a class may build on its own module's classes, the one Database's transactions and anything outside the store
    (``object``, ``Protocol``, ``Enum``...), never on another module's domain class."""
    return [f"{base.__module__}.{base.__qualname__}" for base in klass.__mro__[1:]
            if base.__module__.startswith("recovery_ext._store.")
            and base.__module__ not in (INFRASTRUCTURE, klass.__module__)]


def store_classes() -> list[type]:
    """Every class defined in a module of ``recovery_ext._store``."""
    modules = [importlib.import_module(f"recovery_ext._store.{info.name}")
               for info in pkgutil.iter_modules(recovery_ext._store.__path__)]
    return [klass for module in modules for klass in vars(module).values()
            if inspect.isclass(klass) and klass.__module__ == module.__name__]


def held_components(roots: dict[str, object]) -> dict[str, Component]:
    """Every component, part and collaborator reachable from ``roots`` through attributes that hold a
    :class:`Component`, by the first path that reaches it (``pipelines.nodes.rows``): what a reader follows."""
    found: dict[str, Component] = {}
    seen: set[int] = set()
    pending = list(roots.items())
    while pending:
        path, obj = pending.pop(0)
        for attr, value in vars(obj).items():
            if isinstance(value, Component) and id(value) not in seen:
                seen.add(id(value))
                found[f"{path}.{attr}" if path else attr] = value
                pending.append((f"{path}.{attr}" if path else attr, value))
    return found


def test_no_store_class_has_a_base_class_from_another_domain_module():
    classes = store_classes()
    assert {PipelineCore, LedgerWrites, Component} <= set(classes)
    assert {f"{klass.__module__}.{klass.__qualname__}": bases for klass in classes
            if (bases := foreign_bases(klass))} == {}


def test_the_base_class_check_flags_a_class_built_on_another_modules_class():
    def sample(module: str, *bases: type) -> type:
        return type("Sample", bases, {"__module__": module})

    assert foreign_bases(sample("recovery_ext._store.pipelines", LedgerWrites)) == [
        "recovery_ext._store.ledger.LedgerWrites"]
    assert foreign_bases(sample("recovery_ext._store.reports", sample("recovery_ext._store.ledger", LedgerWrites))) == [
        "recovery_ext._store.ledger.Sample", "recovery_ext._store.ledger.LedgerWrites"]
    assert foreign_bases(sample("recovery_ext._store.ledger", LedgerWrites)) == []  # its own module's class
    assert foreign_bases(sample("recovery_ext._store.pipelines", Component)) == []


def test_every_component_and_part_the_store_holds_is_a_plain_class(store):
    """Each component, each of its parts and each collaborator they hold inherits only the Database's
    transactions (or its own module's classes): a call goes to an object a reader can see."""
    held = held_components({"": store})
    assert {"pipelines.nodes", "pipelines.rows", "pipelines.ledger", "providers.outages", "recovery.orphans",
            "reports.ledger"} <= set(held)
    assert {path: bases for path, component in held.items() if (bases := foreign_bases(type(component)))} == {}
    assert {component._db for component in held.values()} == {store._db}  # one Database: one engine, one budget


def test_the_store_builds_one_pipeline_core_and_every_component_shares_it(store):
    """One PipelineCore (the fence, the node moves, the node steps chosen once) and one LedgerWrites, handed to
    every component that writes for an owner: none builds its own."""
    held = held_components({"": store})
    cores = {id(c): c for c in held.values() if type(c) is PipelineCore}
    ledgers = {id(c): c for c in held.values() if type(c) is LedgerWrites}
    assert len(cores) == 1 and len(ledgers) == 1
    (core,), (ledger,) = cores.values(), ledgers.values()
    assert store.pipelines.rows is store.providers.outages.rows is store.recovery.pipeline_rows is core
    assert core.ledger is store.pipelines.ledger is store.providers.journal.ledger is ledger
    assert store.providers.outages.fence is store.providers.caps.fence is store.pipelines.nodes.fence is core.fence


def test_the_sharing_check_counts_each_pipeline_core_built(store):
    from recovery_ext._store.store import Pipelines, Providers

    db: Database = store._db
    held = held_components({"pipelines": Pipelines(db, rows=PipelineCore(db, ledger=LedgerWrites(db))),
                            "providers": Providers(db, rows=PipelineCore(db, ledger=LedgerWrites(db)))})
    assert len({id(c) for c in held.values() if type(c) is PipelineCore}) == 2
    assert len({id(c) for c in held.values() if type(c) is LedgerWrites}) == 2


def test_the_pipelines_component_holds_its_parts_and_they_share_their_collaborators(store):
    from recovery_ext._store.checkpoints import Checkpoints
    from recovery_ext._store.jobs import ProviderJobs
    from recovery_ext._store.node_transitions import NodeTransitions
    from recovery_ext._store.pipelines import PipelineNodes
    from recovery_ext._store.runs import Runs
    from recovery_ext._store.vouch import Vouching

    pipelines = store.pipelines
    parts = (pipelines.nodes, pipelines.runs, pipelines.checkpoints, pipelines.jobs, pipelines.vouching)
    assert tuple(map(type, parts)) == (PipelineNodes, Runs, Checkpoints, ProviderJobs, Vouching)
    for part in parts:  # each part a plain class over the one Database, none built on another
        assert type(part).__mro__ == (type(part), Component, Transactions, object)
        assert part._db is store._db
    assert (type(pipelines.rows), type(pipelines.ledger)) == (PipelineCore, LedgerWrites)
    # rows is a plain class too, holding the ledger's writes the node steps make (it used to inherit them)
    assert PipelineCore.__mro__ == (PipelineCore, Component, Transactions, object)
    assert pipelines.nodes.rows is pipelines.runs.rows is pipelines.checkpoints.rows is pipelines.rows
    assert pipelines.checkpoints.ledger is pipelines.jobs.ledger is pipelines.ledger is pipelines.rows.ledger
    # the node steps are chosen from the dialect on first use, not when the store is built (hot_path_bench switches
    # the dialect's flags in between), and once: every part reaches the same through rows
    assert "transitions" not in vars(pipelines.rows)
    store.pipelines.list_nodes(0)
    assert "transitions" not in vars(pipelines.rows)
    assert isinstance(pipelines.rows.transitions, NodeTransitions)
    assert isinstance(pipelines.nodes.fence, Fence)
    assert pipelines.nodes.fence is pipelines.runs.fence is pipelines.checkpoints.fence is pipelines.jobs.fence


def test_each_call_of_the_pipelines_component_is_its_parts_call_with_its_docstring(store):
    """The component hands each call to the one part that does it, with that part's docstring; the part's call
    is the one declared ``@retried`` (retries happen once, where the work is)."""
    pipelines = store.pipelines
    parts = (pipelines.nodes, pipelines.runs, pipelines.checkpoints, pipelines.jobs, pipelines.vouching)
    for name in protocol_members(PipelineStore):
        (part,) = [part for part in parts if name in vars(type(part))]
        assert getattr(type(pipelines), name).__doc__ == getattr(type(part), name).__doc__, name
        assert not getattr(getattr(type(pipelines), name), "__rx_retried__", False), name
        assert getattr(getattr(type(part), name), "__rx_retried__", False) == (name != "fenced"), name


def test_the_recovery_component_holds_its_collaborators(store):
    from recovery_ext._store.recovery import Orphans
    from recovery_ext._store.pipelines import PipelineCore

    recovery = store.recovery
    assert (type(recovery.orphans), type(recovery.pipeline_rows)) == (Orphans, PipelineCore)
    assert {recovery._db, recovery.orphans._db, recovery.pipeline_rows._db} == {store._db}
    assert recovery.pipeline_rows is store.pipelines.rows  # the store's one PipelineCore
    assert isinstance(store.queue.fence, Fence)


def test_the_providers_component_holds_its_collaborators(store):
    from recovery_ext._store.breakers import Outages
    from recovery_ext._store.budgets import RateBudgets
    from recovery_ext._store.journal import CallJournal
    from recovery_ext._store.ledger import LedgerWrites
    from recovery_ext._store.node_transitions import NodeTransitions
    from recovery_ext._store.spend_caps import SpendCapAccounts

    providers = store.providers
    parts = (providers.outages, providers.journal, providers.budgets, providers.caps)
    assert tuple(map(type, parts)) == (Outages, CallJournal, RateBudgets, SpendCapAccounts)
    # each part is a plain class over the one Database: no part is built on another part or on PipelineCore
    for part in parts:
        assert [base.__module__ for base in type(part).__mro__[1:]] == [
            "recovery_ext._store.database", "recovery_ext._store.database", "builtins"], type(part)
    assert {part._db for part in parts} | {providers.journal.ledger._db} == {store._db}
    assert type(providers.journal.ledger) is LedgerWrites
    # the breaker read's node steps are chosen from the dialect on first use, as the pipelines parts' are: the
    # same choice, made once, through the store's one PipelineCore
    assert providers.outages.rows is store.pipelines.rows
    assert "transitions" not in vars(providers.outages.rows)
    assert isinstance(providers.outages.node_steps, NodeTransitions)
    assert providers.outages.node_steps is store.pipelines.rows.transitions
    # one fence for the writes of an owner, whichever part (or component) makes them
    assert isinstance(providers.outages.fence, Fence) and providers.caps.fence is providers.outages.fence
    assert providers.outages.fence is store.pipelines.rows.fence


def test_each_providers_call_goes_to_the_part_that_defines_it_with_its_docstring(store):
    """``store.providers.x`` hands the call to the one part defining ``x`` (retried there), and says what it does
    in that part's words."""
    parts = [store.providers.outages, store.providers.journal, store.providers.budgets, store.providers.caps]
    for name in protocol_members(ProviderStore):
        owners = [part for part in parts if callable(getattr(type(part), name, None))]
        assert len(owners) == 1, name
        defined = getattr(type(owners[0]), name)
        assert getattr(defined, "__rx_retried__", False), name
        assert getattr(type(store.providers), name).__doc__ == defined.__doc__, name


# What interfaces.py may import from the library: the values (models.py, and through it provider_values.py and
# admin_values.py) and the status enums. Never an implementation module: a protocol that names a type of the code
# implementing it would make every caller's view depend on that code.
INTERFACE_IMPORTS = {"recovery_ext._store.models", "recovery_ext._store.statuses"}


def library_imports(path: Path) -> set[str]:
    """Every ``recovery_ext`` module ``path`` imports, at run time or for the type checker alone."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("recovery_ext"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("recovery_ext"))
    return found


def test_the_interfaces_import_only_the_values_and_the_statuses():
    assert library_imports(LIBRARY / "_store" / "interfaces.py") - INTERFACE_IMPORTS == set()
    assert "recovery_ext._store.models" in library_imports(LIBRARY / "_store" / "interfaces.py")


def test_the_import_check_sees_a_type_checking_import_of_an_implementation_module(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nimport sqlalchemy\nif TYPE_CHECKING:\n"
                      "    from recovery_ext._store.models import Ownership\n"
                      "    from recovery_ext._store.spend_caps import SpendCapAccounts\n    import recovery_ext._cli\n")
    assert library_imports(sample) == {"recovery_ext._store.models", "recovery_ext._store.spend_caps",
                                       "recovery_ext._cli"}


def test_the_values_modules_are_reached_through_models_only():
    """provider_values.py and admin_values.py are models.py's parts: everything else imports their values from
    models, so there is one place a value is named from."""
    parts = {"recovery_ext._store.provider_values", "recovery_ext._store.admin_values"}
    importers = {str(path.relative_to(LIBRARY)) for path in LIBRARY.rglob("*.py") if library_imports(path) & parts}
    assert importers == {"_store/models.py"}


def test_the_store_offers_its_components_and_its_lifecycle_only(store):
    assert {name for name in dir(store) if not name.startswith("_")} == STORE_SURFACE
    assert type(store).__mro__ == (type(store), object)


def test_the_stores_former_transaction_helpers_answer_with_a_deprecation(store):
    with pytest.warns(DeprecationWarning, match="RecoveryStore.write is internal"), store.write() as conn:
        assert conn.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
    with pytest.raises(AttributeError):
        store.no_such_helper  # noqa: B018


def test_the_components_share_the_stores_retry_budget(store):
    store.retry_budget = 7.0
    assert {getattr(store, name).retry_budget for name in COMPONENTS} == {7.0}
