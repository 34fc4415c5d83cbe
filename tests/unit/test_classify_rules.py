"""Users teach the classifier: register_rule and the recovery_ext.classifier_rules entry points."""

from __future__ import annotations

import logging
import textwrap

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
