"""Rules users add: consulted before every built-in rule of the classifier.

A rule is either a callable ``rule(exc) -> Classification | bool | None`` (None: no opinion) or an
exception type with a verdict (``register_rule(MyError, retryable=True)``). Rules come from
:func:`register_rule` and, once, lazily, from the ``recovery_ext.classifier_rules`` entry point group
(each entry point names a rule, or a list of rules). A rule that raises is logged once and ignored:
it never breaks classification.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import cast

from recovery_ext._classify.verdict import CATEGORIES, Classification
from recovery_ext._errors import ConfigurationError

ENTRY_POINT_GROUP = "recovery_ext.classifier_rules"
Rule = Callable[[BaseException], "Classification | bool | None"]

log = logging.getLogger("recovery_ext.classify")
_registered: list[Rule] = []
_from_entry_points: list[Rule] | None = None
# Keyed by id, and holding the rule: a rule that was freed could leave its id to a new rule, whose
# complaint would then never be logged.
_complained: dict[int, Rule] = {}
_lock = threading.Lock()


def register_rule(rule: Rule | type[BaseException], *, retryable: bool | None = None,
                  category: str | None = None) -> Rule:
    """Teach the classifier: ``register_rule(fn)`` (also a decorator) or ``register_rule(MyError, retryable=...)``.

    Rules are consulted before the built-in ones, in the order registered, for each exception of a
    chain from the outermost; the first answer decides. Returns the rule (for :func:`unregister_rule`).
    """
    if category is not None and category not in CATEGORIES:
        raise ConfigurationError(f"unknown category {category!r}; one of: {', '.join(CATEGORIES)}")
    if isinstance(rule, type) and issubclass(rule, BaseException):
        if retryable is None:
            raise ConfigurationError(f"register_rule({rule.__name__}, ...) needs retryable=True or False")
        rule = _type_rule(rule, Classification(retryable, category or "unknown", None, f"rule for {rule.__name__}"))
    elif not callable(rule):
        raise ConfigurationError(f"a classifier rule is a callable or an exception type, not {type(rule).__name__}")
    elif retryable is not None or category is not None:
        raise ConfigurationError("retryable= and category= go with an exception type, not a callable rule")
    # callable() leaves mypy a class that is not an exception: called with the error, it is a rule too
    checked = cast(Rule, rule)
    with _lock:
        _registered.append(checked)
    return checked


def unregister_rule(rule: Rule) -> None:
    with _lock:
        if rule in _registered:
            _registered.remove(rule)


def _type_rule(kind: type[BaseException], verdict: Classification) -> Rule:
    def rule(exc: BaseException) -> Classification | None:
        return verdict if isinstance(exc, kind) else None

    rule.__qualname__ = f"rule_for_{kind.__name__}"
    return rule


def _load_entry_points() -> list[Rule]:
    from importlib.metadata import entry_points  # on first classification, not on import: it costs milliseconds

    found: list[Rule] = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break classification
            log.warning("classifier rule %s could not be loaded (%s); ignored", point.name, type(exc).__name__)
            continue
        for rule in loaded if isinstance(loaded, (list, tuple)) else (loaded,):
            if callable(rule):
                found.append(rule)
            else:
                log.warning("classifier rule %s is not callable; ignored", point.name)
    return found


def rules() -> list[Rule]:
    global _from_entry_points
    if _from_entry_points is None:
        with _lock:
            if _from_entry_points is None:
                _from_entry_points = _load_entry_points()
    return _registered + _from_entry_points if _from_entry_points else _registered


def reload_entry_points() -> None:
    """Read the entry point group again on next use (after installing a package that adds rules)."""
    global _from_entry_points
    with _lock:
        _from_entry_points = None


def _ask(rule: Rule, exc: BaseException) -> Classification | None:
    try:
        answer = rule(exc)
    except Exception as failure:  # noqa: BLE001 - a failing rule is ignored, never fatal
        if id(rule) not in _complained:
            _complained[id(rule)] = rule
            log.warning("classifier rule %s raised %s; ignored", getattr(rule, "__qualname__", rule),
                        type(failure).__name__)
        return None
    if isinstance(answer, bool):
        return Classification(answer, "unknown", None, f"rule {getattr(rule, '__qualname__', 'rule')}")
    if isinstance(answer, Classification):
        return answer
    return None


def user_verdict(chain: list[BaseException]) -> Classification | None:
    """The answer of the first rule that has one, for the outermost exception any rule answers."""
    active = rules()
    if not active:
        return None
    for link in chain:
        for rule in active:
            verdict = _ask(rule, link)
            if verdict is not None:
                return verdict
    return None
