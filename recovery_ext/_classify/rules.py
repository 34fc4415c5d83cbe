"""Rules users add: consulted before every built-in rule of the classifier.

A rule is either a callable ``rule(exc) -> Classification | bool | None`` (None: no opinion) or an
exception type with a verdict (``register_rule(MyError, retryable=True)``). Rules come from
:func:`register_rule` and, once, lazily, from the ``recovery_ext.classifier_rules`` entry point group
(each entry point names a rule, or a list of rules). A rule that raises (``KeyboardInterrupt`` and
``SystemExit`` too) or answers something else than a verdict, and a plugin that fails to load (even by
calling ``sys.exit``), is logged once and ignored: it never breaks classification.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import FrameType
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
_loaded = threading.Condition(_lock)  # the entry points were read (waited on while another thread reads them)
_loader: int | None = None  # the thread reading the entry points, if one is


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
        with _interrupts_held():
            loaded, failure = _guarded(point.load)
        if failure is not None:
            log.warning("classifier rule %s could not be loaded (%s); ignored", point.name, type(failure).__name__)
            continue
        for rule in loaded if isinstance(loaded, (list, tuple)) else (loaded,):
            if callable(rule):
                found.append(rule)
            else:
                log.warning("classifier rule %s is not callable; ignored", point.name)
    return found


def rules() -> list[Rule]:
    if _from_entry_points is None:
        _load_once()
    return _registered + _from_entry_points if _from_entry_points else _registered


def _load_once() -> None:
    """Import the plugins once, without holding the lock: a plugin may ``@register_rule`` or classify while
    it is imported (that thread then sees the rules registered so far); other threads wait for the load."""
    global _from_entry_points, _loader
    me = threading.get_ident()
    with _loaded:
        while _from_entry_points is None and _loader is not None and _loader != me:
            _loaded.wait()
        if _from_entry_points is not None or _loader == me:
            return
        _loader = me
    found: list[Rule] = []
    try:
        found = _load_entry_points()
    finally:
        with _loaded:
            _from_entry_points, _loader = found, None
            _loaded.notify_all()


def reload_entry_points() -> None:
    """Read the entry point group again on next use (after installing a package that adds rules)."""
    global _from_entry_points
    with _lock:
        _from_entry_points = None


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Run plugin code with a real Ctrl-C held back until it returns, then delivered as usual.

    Python raises a Ctrl-C as ``KeyboardInterrupt`` wherever the main thread is, so one raised inside a
    rule could be the user's or the rule's own. With SIGINT's handler swapped for one that only notes the
    signal, a ``KeyboardInterrupt`` out of the rule is the rule's (ignored like any failure), and the
    user's Ctrl-C interrupts the caller right after the rule returns. Other threads never receive it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[tuple[int, FrameType | None]] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append((signum, frame)))
    except (ValueError, OSError):  # not the main interpreter: no handler to hold
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed:
            if callable(previous):
                previous(*pressed[0])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


_inside_a_rule: ContextVar[bool] = ContextVar("recovery_ext_inside_a_rule", default=False)


def _complain_once(rule: Rule, what: str) -> None:
    if id(rule) not in _complained:
        _complained[id(rule)] = rule
        log.warning("classifier rule %s %s; ignored", getattr(rule, "__qualname__", rule), what)


def _guarded(call: Callable[[], object]) -> tuple[object, BaseException | None]:
    """Plugin code's answer, or what it raised: ``KeyboardInterrupt`` and ``SystemExit`` too. Called under
    :func:`_interrupts_held`, so a real Ctrl-C is not among them: it reaches the caller afterwards."""
    try:
        return call(), None
    except BaseException as failure:  # noqa: BLE001 - misbehaving plugin code is ignored, never fatal
        return None, failure


def _ask(rule: Rule, exc: BaseException) -> Classification | None:
    token = _inside_a_rule.set(True)
    try:
        answer, failure = _guarded(lambda: rule(exc))
    finally:
        _inside_a_rule.reset(token)
    if failure is not None:
        _complain_once(rule, f"raised {type(failure).__name__}")
        return None
    if isinstance(answer, bool):
        return Classification(answer, "unknown", None, f"rule {getattr(rule, '__qualname__', 'rule')}")
    if isinstance(answer, Classification) or answer is None:
        return answer
    _complain_once(rule, f"answered a {type(answer).__name__} (a rule answers a Classification, a bool or None)")
    return None


def user_verdict(chain: list[BaseException]) -> Classification | None:
    """The answer of the first rule that has one, for the outermost exception any rule answers.

    A rule may call ``classify`` itself: inside a rule, the classifier answers without consulting the
    rules (the built-in verdict), so a rule cannot recurse into itself.
    """
    if _inside_a_rule.get():
        return None
    active = rules()
    if not active:
        return None
    with _interrupts_held():  # once per classification: swapping the handler costs a system call
        for link in chain:
            for rule in active:
                verdict = _ask(rule, link)
                if verdict is not None:
                    return verdict
    return None
