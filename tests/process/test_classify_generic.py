"""The classifier against the third corpus: real exceptions from libraries it has no family for
(tests/support/classify_corpus_generic.py and tests/support/classify_corpus_local.py), raised against
servers this test starts on 127.0.0.1, the local RabbitMQ and NATS, and this machine's own resources."""

from __future__ import annotations

from collections import Counter

import pytest
from classify_corpus_generic import build_http_generic_corpus
from classify_corpus_libraries import assert_test_only_dependencies
from classify_corpus_local import build_local_generic_corpus

from recovery_ext import classify


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_http_generic_corpus() + build_local_generic_corpus(tmp_path_factory.mktemp("generic-corpus"))


def test_the_corpus_is_large_balanced_explained_and_from_libraries_without_a_family(corpus):
    labels = Counter(case.retryable for case in corpus)
    assert len(corpus) >= 150, len(corpus)
    assert labels[True] >= 50 and labels[False] >= 50, labels
    assert len({case.name for case in corpus}) == len(corpus), "case names must be unique"
    assert all(len(case.how) > 20 for case in corpus), "every case says how it was produced"
    libraries = Counter(type(case.error).__module__.split(".")[0] for case in corpus)
    for library in ("groq", "ollama", "huggingface_hub", "elasticsearch", "opensearchpy", "meilisearch", "typesense",
                    "pika", "paho", "nats", "ftplib", "paramiko", "pymongo", "pytesseract", "pydantic_core"):
        assert libraries[library] >= 2, (library, libraries)
    # the libraries the classifier had a family for when this corpus was made (ftplib, pika, pymongo and
    # nats-py got theirs afterwards, for the facts of theirs that are not generic)
    had_a_family = {"anthropic", "openai", "botocore", "google", "grpc", "httpx", "httpcore", "httpx2", "httpcore2",
                    "urllib3", "aiohttp",
                    "websockets", "psycopg", "psycopg2", "sqlalchemy", "pymysql", "MySQLdb", "mysql", "asyncpg",
                    "redis", "smtplib", "kombu", "amqp", "celery", "billiard", "dagster"}
    # the EMFILE cases go through requests, urllib and httpx on purpose: a wrapper must not hide the local cause
    outermost = {type(case.error).__module__.split(".")[0] for case in corpus if not case.name.startswith("emfile-")}
    assert not had_a_family & outermost, had_a_family & outermost


def test_classifier_accuracy_on_the_generic_corpus(corpus):
    wrong = []
    for case in corpus:
        found = classify(case.error)
        if found.retryable is not case.retryable:
            wrong.append(f"{case.name}: expected {'transient' if case.retryable else 'permanent'}, got "
                         f"{found.category} ({found.reason}) for {type(case.error).__name__}: {str(case.error)[:160]}"
                         f" [{case.how}]")
    accuracy = 1 - len(wrong) / len(corpus)
    print(f"\nclassifier accuracy on {len(corpus)} real exceptions from libraries without a family: {accuracy:.3f}")
    assert accuracy >= 0.98, "\n".join(wrong)


def test_the_corpus_libraries_are_test_only_dependencies():
    assert_test_only_dependencies(("groq", "ollama", "huggingface_hub", "elasticsearch", "opensearch-py", "meilisearch",
                                   "typesense", "pika", "paho-mqtt", "nats-py", "paramiko", "pymongo", "pytesseract",
                                   "orjson", "jsonschema"))
