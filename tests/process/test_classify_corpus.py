"""The classifier against a labelled corpus of real exceptions (tests/support/classify_corpus.py): 100 % required."""

from __future__ import annotations

from collections import Counter

import pytest
from classify_corpus import build_corpus
from databases import create_pg_database, drop_pg_database

from recovery_ext._classify.classifier import classify


@pytest.fixture(scope="module")
def corpus(pg_admin, tmp_path_factory):
    url = create_pg_database(pg_admin)
    try:
        yield build_corpus(url, tmp_path_factory.mktemp("corpus"))
    finally:
        drop_pg_database(pg_admin, url)


def test_corpus_is_large_and_balanced(corpus):
    labels = Counter(case.retryable for case in corpus)
    assert len(corpus) >= 150, len(corpus)
    assert labels[True] >= 50 and labels[False] >= 50, labels
    assert len({case.name for case in corpus}) == len(corpus), "case names must be unique"


def test_classifier_accuracy_on_the_corpus(corpus):
    wrong = []
    for case in corpus:
        found = classify(case.error)
        if found.retryable is not case.retryable:
            wrong.append(f"{case.name}: expected {'transient' if case.retryable else 'permanent'}, got "
                         f"{found.category} ({found.reason}) for {type(case.error).__name__}: {str(case.error)[:160]}")
    accuracy = 1 - len(wrong) / len(corpus)
    print(f"\nclassifier accuracy on {len(corpus)} real exceptions: {accuracy:.3f}")
    assert not wrong, "\n".join(wrong)
