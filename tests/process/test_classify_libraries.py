"""The classifier against the library corpus (tests/support/classify_corpus_libraries.py and
tests/support/classify_corpus_stores.py): real exceptions from botocore, gRPC, google-api-core, the LLM SDKs,
aiohttp, urllib3, websockets, redis-py, PyMySQL/MariaDB, asyncpg, smtplib and kombu/RabbitMQ."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from classify_corpus_libraries import assert_test_only_dependencies, build_http_corpus
from classify_corpus_stores import build_store_corpus
from databases import pg_database

from recovery_ext import classify
from recovery_ext._classify import families


@pytest.fixture(scope="module")
def corpus(pg_admin):
    with pg_database(pg_admin) as url:
        yield build_http_corpus() + build_store_corpus(url)


def test_corpus_is_large_balanced_and_explained(corpus):
    labels = Counter(case.retryable for case in corpus)
    assert len(corpus) >= 150, len(corpus)
    assert labels[True] >= 50 and labels[False] >= 50, labels
    assert len({case.name for case in corpus}) == len(corpus), "case names must be unique"
    assert all(len(case.how) > 20 for case in corpus), "every case says how it was produced"
    constructed = [case.name for case in corpus if case.constructed]
    assert len(constructed) <= 5, constructed
    libraries = Counter(type(case.error).__module__.split(".")[0] for case in corpus)
    for library in ("botocore", "grpc", "google", "anthropic", "openai", "mistralai", "cohere", "litellm", "aiohttp",
                    "urllib3", "websockets", "redis", "pymysql", "asyncpg", "smtplib", "amqp", "celery", "dagster"):
        assert libraries[library] >= 2, (library, libraries)


def test_classifier_accuracy_on_the_library_corpus(corpus):
    wrong = []
    for case in corpus:
        found = classify(case.error)
        if found.retryable is not case.retryable:
            wrong.append(f"{case.name}: expected {'transient' if case.retryable else 'permanent'}, got "
                         f"{found.category} ({found.reason}) for {type(case.error).__name__}: {str(case.error)[:160]}"
                         f" [{case.how}]")
    accuracy = 1 - len(wrong) / len(corpus)
    print(f"\nclassifier accuracy on {len(corpus)} real library exceptions: {accuracy:.3f}")
    assert accuracy >= 0.98, "\n".join(wrong)


def test_a_family_is_loaded_only_once_its_library_is_imported():
    script = textwrap.dedent("""
        import sys
        import recovery_ext
        from recovery_ext import classify
        classify(ValueError("x"))
        loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("recovery_ext._classify.families."))
        libraries = sorted({"botocore", "grpc", "redis", "pymysql", "asyncpg", "aiohttp", "websockets", "anthropic",
                            "kombu", "dagster", "smtplib"} & set(sys.modules))
        print(loaded, libraries)
        import smtplib
        classify(smtplib.SMTPServerDisconnected("gone"))
        print("smtp" in {m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("recovery_ext._classify.families.")})
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    loaded, libraries = out[0].split("] [")
    assert "botocore" not in loaded and "redis" not in loaded and "dagster" not in loaded, loaded
    assert libraries == "]", f"classifying imported libraries: {libraries}"
    assert out[1] == "True"


def test_a_new_family_is_one_module_and_one_registration(tmp_path, monkeypatch):
    (tmp_path / "acme_sdk.py").write_text("class Throttled(Exception):\n    pass\n")
    (tmp_path / "acme_ext").mkdir()
    (tmp_path / "acme_ext" / "__init__.py").write_text("")
    (tmp_path / "acme_ext" / "family.py").write_text(textwrap.dedent("""
        from recovery_ext._classify.families import Family, by_type, loaded_types
        from recovery_ext._classify.verdict import transient

        def family():
            return Family(structure=by_type([(loaded_types("acme_sdk", "Throttled"),
                                              transient("rate_limit", "acme: throttled"))]))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import acme_sdk

    assert classify(acme_sdk.Throttled("slow down")).retryable is False
    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))
    families.register_family("acme_ext.family", "acme_sdk")
    try:
        found = classify(acme_sdk.Throttled("slow down"))
        assert (found.retryable, found.category) == (True, "rate_limit")
    finally:
        monkeypatch.undo()
        families.forget()
    assert classify(acme_sdk.Throttled("slow down")).retryable is False


def test_the_corpus_libraries_are_test_only_dependencies():
    assert_test_only_dependencies(("botocore", "grpcio", "google-api-core", "google-genai", "anthropic", "mistralai",
                                   "cohere", "litellm", "aiohttp", "urllib3", "websockets", "redis", "pymysql",
                                   "asyncpg", "kombu"))
