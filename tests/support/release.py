"""A demo-like study in a real store and the `sense7` command run in the test process, for the release, export
and participation tests; the small synthetic study and isolated settings of the import tests."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sense7.cli import app
from sense7.synthetic import synth
from sense7.data.conversations import Conversation, Message
from sense7.store.rater_page_tables import LinkBook
from sense7.store.database import Store
from sense7.settings import Settings
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()


runner = CliRunner()


def fill_study(store: Store, n_conversations: int, n_raters: int, seed: int = 5):
    data = synth.generate(n_conversations, n_raters, seed=seed, taxonomy=TAXONOMY)
    rows = [{"rater_id": r["rater_id"], "email": r["email"],
             "traits": {k: v for k, v in r.items() if k not in ("rater_id", "email")}}
            for r in data.raters.to_dict("records")]
    store.upsert_raters(rows)
    owner = data.conversations[0]
    # A conversation imported with --no-scrub: the release scrubs it again.
    data.conversations[0] = Conversation(owner.conversation_id, owner.rater_id, [
        Message("user", "I'm Sam, write me at sam.rivers@mail.example or +1 415 555 0132 " + owner.messages[0].content),
        *owner.messages[1:]], dict(owner.context, created="2025-03-14T10:00:00+00:00", title="Sam's dog"))
    store.upsert_conversations(data.conversations)
    store.import_ratings(data.ratings)
    return data


def demo_like_study(tmp_path, monkeypatch):
    """A demo-like demo_like_study (the demo's 6 raters, 40 conversations, one link issued) in this test's home."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("SENSE7_STORE_URL", "SENSE7_MODEL_DIR", "SENSE7_TAXONOMY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SENSE7_HOME", str(home))
    store = Store(f"sqlite:///{home / 'store.sqlite'}")
    data = fill_study(store, 40, 6)
    secret = LinkBook(store).issue("r001")
    return store, data, secret


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def release_rows(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / "data" / f"{name}.jsonl").read_text().splitlines()]


def small_synthetic_study():
    return synth.generate(40, 8, seed=5, taxonomy=TAXONOMY)


def labelstudio_settings(label_studio, tmp_path) -> Settings:
    return Settings.from_env({**label_studio.settings_env(), "SENSE7_HOME": str(tmp_path / "home"),
                              "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
                              "SENSE7_MODEL_DIR": str(tmp_path / "models")})
