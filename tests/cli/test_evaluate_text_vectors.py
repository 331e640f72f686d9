"""`sense7 evaluate --text-encoder static` keeps each text's vector in a private file by text hash
(--text-vectors; evaluate has no store): a second run reads them and gives the same result; a folder or an
unwritable path is one clear error line and nothing is evaluated."""

from __future__ import annotations

import json
import os
import stat

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.store.text_vectors import TextVectorRows
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy

runner = CliRunner()


@pytest.fixture
def study_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "home"))
    synth.write(synth.generate(12, 4, seed=7, taxonomy=load_taxonomy()), tmp_path / "data")
    data = tmp_path / "data"
    return ["--conversations", str(data / "conversations.jsonl"), "--ratings", str(data / "ratings.csv"),
            "--raters", str(data / "raters.csv"), "--splits", "known_rater", "--folds", "2", "--boot", "0",
            "--models", "generic"]


@pytest.mark.parametrize("where", ["folder", "under-a-file"])
def test_a_text_vectors_path_that_cannot_hold_them_is_one_clear_error(study_files, tmp_path, where):
    (tmp_path / "a-file").write_text("not a folder")
    path = tmp_path if where == "folder" else tmp_path / "a-file" / "vectors.sqlite"
    out = tmp_path / "result.json"
    result = runner.invoke(app, ["evaluate", *study_files, "--text-encoder", "static", "--text-vectors", str(path),
                                 "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert "--text-vectors" in result.output and "Traceback" not in result.output and not out.exists()


@pytest.mark.slow  # the static encoder's packaged table (made on its first use in an installation)
def test_evaluate_keeps_vectors_by_text_hash_and_a_second_run_reads_them(study_files, tmp_path):
    vectors = tmp_path / "vectors" / "text-vectors.sqlite"
    results = []
    for run in range(2):
        out = tmp_path / f"result-{run}.json"
        result = runner.invoke(app, ["evaluate", *study_files, "--text-encoder", "static", "--text-vectors",
                                     str(vectors), "--json", str(out)])
        assert result.exit_code == 0, result.output
        splits = json.loads(out.read_text())["splits"]
        for block in splits.values():
            block.pop("fit_predict_seconds")  # (the one figure that differs: the second run embeds nothing)
        results.append(splits)
        if run == 0:
            stored = TextVectorRows.local(vectors).count()
            assert stored > 0
    assert TextVectorRows.local(vectors).count() == stored  # nothing new: every text was read, not embedded
    assert results[0] == results[1]
    assert stat.S_IMODE(os.stat(vectors).st_mode) == 0o600
