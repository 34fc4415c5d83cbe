"""Users teach the classifier: register_rule and the recovery_ext.classifier_rules entry points."""

from __future__ import annotations

import logging
import signal
import sys
import textwrap
import threading

import httpx
import pytest

import recovery_ext
from recovery_ext import Classification, ConfigurationError, classify, register_rule
from recovery_ext._classify import rules


@pytest.fixture
def registered():
    added: list = []

    def add(*args, **kwargs):
        rule = register_rule(*args, **kwargs)
        added.append(rule)
        return rule

    yield add
    for rule in added:
        rules.unregister_rule(rule)


def http_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1/v1")
    return httpx.HTTPStatusError("boom", request=request, response=httpx.Response(status, request=request))


class QuotaWall(Exception):
    """An application's own error: the classifier knows nothing of it."""


def test_register_rule_is_public():
    assert "register_rule" in recovery_ext.__all__


def test_a_user_exception_type_gets_the_verdict_it_was_given(registered):
    assert classify(QuotaWall("try again at midnight")).retryable is False
    registered(QuotaWall, retryable=True, category="rate_limit")
    found = classify(QuotaWall("try again at midnight"))
    assert (found.retryable, found.category) == (True, "rate_limit")
    try:  # and as the cause of a wrapper
        raise RuntimeError("step failed") from QuotaWall("later")
    except RuntimeError as exc:
        assert classify(exc).retryable is True


def test_a_rule_overrides_a_built_in_verdict(registered):
    assert classify(http_error(409)).retryable is False

    @registered
    def conflicts_resolve_themselves(exc: BaseException):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        return Classification(True, "server_error", 409, "our API answers 409 while a lock is held") \
            if status == 409 else None

    found = classify(http_error(409))
    assert found.retryable is True and found.reason.startswith("our API")
    assert classify(http_error(400)).retryable is False  # no opinion: the built-in rules decide


def test_a_bool_answer_and_a_later_rule(registered):
    registered(lambda exc: False if isinstance(exc, TimeoutError) else None)
    registered(lambda exc: True)  # consulted after the first, which already answered for timeouts
    assert classify(TimeoutError("slow")).retryable is False
    assert classify(ValueError("bad")).retryable is True


def test_a_rule_that_raises_is_ignored_and_logged_once(registered, caplog):
    @registered
    def broken(exc: BaseException):
        raise KeyError("bug in the rule")

    with caplog.at_level(logging.WARNING, logger="recovery_ext.classify"):
        for _ in range(3):
            assert classify(http_error(503)).retryable is True
            assert classify(http_error(404)).retryable is False
    complaints = [r for r in caplog.records if "broken" in r.getMessage()]
    assert len(complaints) == 1 and "KeyError" in complaints[0].getMessage()


def test_each_failing_rule_is_complained_of_once_even_after_earlier_ones_were_freed(caplog):
    """A freed rule's id is soon another rule's: remembering complaints by id alone left later rules unlogged."""
    with caplog.at_level(logging.WARNING, logger="recovery_ext.classify"):
        for n in range(20):
            def failing(exc, n=n):
                raise RuntimeError(f"plugin bug {n}")

            register_rule(failing)
            try:
                assert classify(QuotaWall("x")).retryable is False
                assert classify(QuotaWall("x")).retryable is False
            finally:
                rules.unregister_rule(failing)
            del failing
    complaints = [r for r in caplog.records if "raised RuntimeError" in r.getMessage()]
    assert len(complaints) == 20, [r.getMessage() for r in complaints]


def test_bad_registrations_say_what_is_wrong(registered):
    with pytest.raises(ConfigurationError, match="retryable=True or False"):
        registered(QuotaWall)
    with pytest.raises(ConfigurationError, match="unknown category"):
        registered(QuotaWall, retryable=True, category="sometimes")
    with pytest.raises(ConfigurationError, match="callable or an exception type"):
        registered("QuotaWall")


def test_an_installed_package_adds_rules_through_the_entry_point(tmp_path, monkeypatch, caplog):
    (tmp_path / "acme_rules.py").write_text(textwrap.dedent("""
        class AcmeBusy(Exception):
            pass

        def acme(exc):
            return True if isinstance(exc, AcmeBusy) else None

        def broken(exc):
            raise RuntimeError("plugin bug")
    """))
    info = tmp_path / "acme_rules-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-rules\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[recovery_ext.classifier_rules]\nacme = acme_rules:acme\nbroken = acme_rules:broken\n"
        "missing = acme_rules:no_such_rule\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rules.reload_entry_points()
    try:
        import acme_rules

        with caplog.at_level(logging.WARNING, logger="recovery_ext.classify"):
            assert classify(acme_rules.AcmeBusy("busy")).retryable is True
            assert classify(ValueError("bad")).retryable is False
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "missing" in messages and "broken" in messages
    finally:
        monkeypatch.undo()
        rules.reload_entry_points()
    assert classify(acme_rules.AcmeBusy("busy")).retryable is False


def _install_plugin(tmp_path, monkeypatch, name: str, source: str) -> None:
    """A real installed distribution whose ``recovery_ext.classifier_rules`` entry point is module ``name``."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[recovery_ext.classifier_rules]\n{name} = {name}:rule\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rules.reload_entry_points()


def _classify_in_a_thread(exc: BaseException):
    """classify(exc) with a deadline: a deadlocked first classification fails the test instead of hanging it."""
    found: list = []
    worker = threading.Thread(target=lambda: found.append(classify(exc)), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():
        rules._lock.release()  # a plain Lock: unstick the deadlocked thread so the session goes on
        worker.join(5)
        pytest.fail("the first classification deadlocked while loading the plugin")
    return found[0]


def test_a_plugin_that_registers_and_classifies_while_imported_does_not_deadlock(tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, "decorating_rules", """
        from recovery_ext import classify, register_rule

        class Slow(Exception):
            pass

        @register_rule
        def registered_at_import(exc):
            return True if isinstance(exc, Slow) else None

        SEEN_AT_IMPORT = classify(TimeoutError("while importing"))
        rule = registered_at_import
    """)
    try:
        found = _classify_in_a_thread(ValueError("first classification of the process"))
        import decorating_rules

        assert found.retryable is False
        assert decorating_rules.SEEN_AT_IMPORT.retryable is True
        assert classify(decorating_rules.Slow("x")).retryable is True
    finally:
        monkeypatch.undo()
        rules.unregister_rule(sys.modules["decorating_rules"].registered_at_import)
        rules.reload_entry_points()


def test_a_plugin_that_exits_at_import_is_logged_and_ignored(tmp_path, monkeypatch, caplog):
    _install_plugin(tmp_path, monkeypatch, "exiting_rules", """
        import sys
        sys.exit("this plugin refuses to load")
    """)
    try:
        with caplog.at_level(logging.WARNING, logger="recovery_ext.classify"):
            assert classify(TimeoutError("slow")).retryable is True
        assert any("exiting_rules" in r.getMessage() and "SystemExit" in r.getMessage() for r in caplog.records)
    finally:
        monkeypatch.undo()
        rules.reload_entry_points()


def test_a_rule_raising_keyboard_interrupt_is_logged_once_and_ignored(registered, caplog):
    @registered
    def interrupting(exc: BaseException):
        raise KeyboardInterrupt

    with caplog.at_level(logging.WARNING, logger="recovery_ext.classify"):
        for _ in range(2):
            assert classify(TimeoutError("slow")).retryable is True
    complaints = [r for r in caplog.records if "interrupting" in r.getMessage()]
    assert len(complaints) == 1 and "KeyboardInterrupt" in complaints[0].getMessage()


def test_a_real_ctrl_c_while_a_rule_runs_still_interrupts(registered):
    """Ctrl-C pressed during a rule is held until the rules are done, then interrupts as usual."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("this test sends SIGINT to its own process: it must run on the main thread")

    finished: list[bool] = []

    @registered
    def slow_rule(exc: BaseException):
        signal.raise_signal(signal.SIGINT)  # delivered while the rule runs, as a user's Ctrl-C would be
        finished.append(True)
        return None

    with pytest.raises(KeyboardInterrupt):
        classify(TimeoutError("slow"))
    assert finished == [True], "the rule was interrupted halfway"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_rule_that_classifies_gets_the_built_in_verdict(registered):
    @registered
    def defers_to_the_built_in(exc: BaseException):
        return classify(exc)

    found = classify(TimeoutError("slow"))
    assert (found.retryable, found.category) == (True, "timeout")


@pytest.mark.parametrize("answer", [1, "retry", {}, 0.5])
def test_an_answer_that_is_not_a_verdict_is_complained_of_once(registered, caplog, answer):
    def odd(exc: BaseException):
        return answer

    registered(odd)
    with caplog.at_level(logging.WARNING, logger="recovery_ext.classify"):
        for _ in range(3):
            assert classify(TimeoutError("slow")).retryable is True
    complaints = [r for r in caplog.records if "odd" in r.getMessage()]
    assert len(complaints) == 1, [r.getMessage() for r in caplog.records]
    assert type(answer).__name__ in complaints[0].getMessage()
