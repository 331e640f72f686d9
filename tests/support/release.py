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


def home_store(root: Path, env) -> Store:
    """A new SQLite store in `root`/home, made this process's SENSE7_HOME with no store, model or taxonomy
    override (`env`: pytest's monkeypatch, or a MonkeyPatch context for a wider-scoped fixture)."""
    home = root / "home"
    home.mkdir()
    for name in ("SENSE7_STORE_URL", "SENSE7_MODEL_DIR", "SENSE7_TAXONOMY"):
        env.delenv(name, raising=False)
    env.setenv("SENSE7_HOME", str(home))
    return Store(f"sqlite:///{home / 'store.sqlite'}")


def rater_rows(data) -> list[dict]:
    """The synthetic study's raters as `Store.upsert_raters` takes them."""
    return [{"rater_id": r["rater_id"], "email": r["email"],
             "traits": {k: v for k, v in r.items() if k not in ("rater_id", "email")}}
            for r in data.raters.to_dict("records")]


def fill_study(store: Store, n_conversations: int, n_raters: int, seed: int = 5):
    data = synth.generate(n_conversations, n_raters, seed=seed, taxonomy=TAXONOMY)
    store.upsert_raters(rater_rows(data))
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
    store = home_store(tmp_path, monkeypatch)
    data = fill_study(store, 40, 6)
    secret = LinkBook(store).issue("r001")
    return store, data, secret


def unusable_target(tmp_path: Path, case: str) -> Path:
    """`tmp_path`/target for a misuse test's `case`: "non-empty" (a folder holding keep.txt), "a file", or
    (any other case) nothing there yet."""
    target = tmp_path / "target"
    if case == "non-empty":
        target.mkdir()
        (target / "keep.txt").write_text("mine")
    elif case == "a file":
        target.write_text("mine")
    return target


def croissant_with_rai_fields(folder: Path, dataset) -> dict:
    """The Croissant document in `folder`, checked: Croissant 1.1, and the RAI annotation fields filled (as
    mlcroissant's `dataset` read them back)."""
    from sense7.privacy.croissant import CROISSANT_FILE

    document = json.loads((folder / CROISSANT_FILE).read_text())
    assert document["conformsTo"] == "http://mlcommons.org/croissant/1.1"
    metadata = dataset.metadata.to_json()
    for key in ("rai:dataAnnotationProtocol", "rai:dataAnnotationPlatform", "rai:annotationsPerItem",
                "rai:annotatorDemographics", "rai:machineAnnotationTools"):
        assert metadata.get(key), key
    return document


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
