"""The bulk n-gram vectorizer equals its per-document definition; `sense7 synth` works as a command."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sense7.cli import synth_cmd
from sense7.model.text import BulkNgramVectorizer

TRAIN = ["That sounds really hard.", "What would help?", "I see. That sounds hard!", "Max is sick; that's hard",
         "", "what WOULD help, Max?"]


@pytest.mark.parametrize("weighting", ["presence", "tfidf"])
def test_bulk_transform_equals_per_document_counts(weighting):
    vec = BulkNgramVectorizer(ngram_max=2, min_df=1, weighting=weighting)
    fitted = vec.fit_transform(TRAIN).toarray()
    again = vec.transform(TRAIN).toarray()
    np.testing.assert_allclose(fitted, again)
    vocab = list(vec.vocabulary_)
    for row, doc in enumerate(TRAIN):
        counts = np.zeros(len(vocab))
        for term in vec.analyze(doc):
            counts[vocab.index(term)] += 1
        if weighting == "presence":
            np.testing.assert_array_equal(again[row], (counts > 0).astype(float))
        else:
            expected = np.where(counts > 0, (1 + np.log(np.maximum(counts, 1))) * vec.idf_, 0)
            norm = np.linalg.norm(expected)
            np.testing.assert_allclose(again[row], expected / norm if norm else expected, rtol=1e-5)
    assert "that sounds" in vocab and "sounds" in vocab and "hard" in vocab


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=6))
def test_bulk_transform_handles_any_text(docs):
    vec = BulkNgramVectorizer(ngram_max=2, min_df=1).fit(TRAIN)
    matrix = vec.transform(docs).toarray()
    vocab = list(vec.vocabulary_)
    assert matrix.shape == (len(docs), len(vocab))
    for row, doc in enumerate(docs):
        present = {t for t in vec.analyze(doc) if t in vec.vocabulary_}
        assert {vocab[i] for i in np.flatnonzero(matrix[row])} == present


def test_min_df_and_max_features_choose_the_vocabulary():
    vec = BulkNgramVectorizer(ngram_max=1, min_df=2).fit(TRAIN)
    assert set(vec.vocabulary_) == {"that", "sounds", "hard", "what", "would", "help", "max", "is"} - {"is"}
    top = BulkNgramVectorizer(ngram_max=1, min_df=1, max_features=2).fit(TRAIN)
    assert list(top.vocabulary_) == ["hard", "that"]  # most frequent (3 each), ties by term


def test_synth_command_writes_deterministic_files(tmp_path):
    app = typer.Typer()
    synth_cmd.register(app)
    app.command("noop")(lambda: None)  # a second command so typer keeps "synth" as a subcommand
    runner = CliRunner()
    digests = []
    for name in ("a", "b"):
        result = runner.invoke(app, ["synth", "--out", str(tmp_path / name), "--conversations", "12",
                                     "--raters", "4", "--seed", "5"])
        assert result.exit_code == 0, result.output
        assert "12 conversation(s), 4 rater(s)" in result.output
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / name).iterdir()})
    assert digests[0] == digests[1] and len(digests[0]) == 3
    bad = runner.invoke(app, ["synth", "--out", str(tmp_path / "c"), "--raters", "2", "--raters-per-conversation", "3"])
    assert bad.exit_code == 2 and not (tmp_path / "c").exists()
    assert "Generate a synthetic study" in runner.invoke(app, ["synth", "--help"]).output
