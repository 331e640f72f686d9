"""Ratings entered by staff on raters' behalf are explicit and logged; they never come from guessing."""

from __future__ import annotations

from typer.testing import CliRunner

from sense7.cli import app
from sense7.store.database import Store
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def test_ratings_import_is_a_logged_staff_entry(tmp_path, monkeypatch):
    synth.write(synth.generate(4, 2, seed=3, taxonomy=TAXONOMY), tmp_path / "data")
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SENSE7_STORE_URL", store_url)
    runner = CliRunner()
    done = runner.invoke(app, ["ratings", "import", str(tmp_path / "data" / "ratings.csv"),
                               "--conversations", str(tmp_path / "data" / "conversations.jsonl")])
    assert done.exit_code == 0, done.output
    written = Store(store_url).counts()["imported_ratings"]
    entries = Store(store_url).staff_entries()
    assert written > 0 and len(entries) == 1
    entry = entries[0]
    assert entry["action"] == "ratings import" and entry["actor"]
    assert entry["detail"] == {"file": str(tmp_path / "data" / "ratings.csv"), "ratings": written, "raters": 2}
    listed = runner.invoke(app, ["ratings", "history", "--staff"])
    assert listed.exit_code == 0 and "ratings import" in listed.output and f'"ratings": {written}' in listed.output
    # A file that fails validation writes neither ratings nor a log entry.
    (tmp_path / "bad.csv").write_text("conversation_id,turn_index,rater_id,dimension,rating\nnope,1,x,overall,9\n")
    bad = runner.invoke(app, ["ratings", "import", str(tmp_path / "bad.csv"),
                              "--conversations", str(tmp_path / "data" / "conversations.jsonl")])
    assert bad.exit_code == 2 and len(Store(store_url).staff_entries()) == 1
