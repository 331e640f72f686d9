"""`sense7 release`: a demo-like study's anonymized release passes its own check; the check catches what a
release must not hold; every misuse is one line and leaves nothing behind."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from sense7.data.conversations import Conversation, Message
from sense7.privacy.release import SUPPRESSED, ReleaseError, build_release, k_anonymous_traits, write_release
from sense7.privacy.release_check import Originals, check_release, originals_from_store
from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook, token_hash
from tests.support.release import (TAXONOMY, demo_like_study, fill_study, home_store, invoke, release_rows,
                                   unusable_target)


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A demo-like study (the demo's 6 raters, 40 conversations, one link issued) in this test's home."""
    return demo_like_study(tmp_path, monkeypatch)


def test_demo_like_study_release_passes_its_check_and_holds_nothing_identifying(study, tmp_path):
    store, data, secret = study
    out = tmp_path / "release"
    result = invoke("release", "--out", out)
    assert result.exit_code == 0, result.output
    assert "the check passes" in result.output
    assert {oct(path.stat().st_mode & 0o777) for path in [out, *out.rglob("*")]} <= {"0o600", "0o700"}
    checked = invoke("release", "--check", out)
    assert checked.exit_code == 0 and "passes (k=5" in " ".join(checked.output.split()), checked.output
    stricter = invoke("release", "--check", out, "--k", "6")
    assert stricter.exit_code == 2 and "claims k=5, less than the 6 asked for" in " ".join(stricter.output.split())

    ratings, raters = release_rows(out, "ratings"), release_rows(out, "raters")
    assert len(ratings) == len(data.ratings)  # every control and the expectation answer of every turn
    assert Counter(r["dimension"] for r in ratings) == Counter(data.ratings["dimension"])
    assert len(raters) == 6 and not {r["rater_id"] for r in raters} & set(data.raters["rater_id"])
    combos = Counter(tuple(v for key, v in r.items() if key != "rater_id") for r in raters)
    assert all(n >= 5 or set(combo) == {SUPPRESSED} for combo, n in combos.items())
    blob = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "sam.rivers" not in blob and "555 0132" not in blob and "[EMAIL_1]" in blob and "[PHONE_1]" in blob
    assert "@example.org" not in blob and secret not in blob and "Sam's dog" not in blob
    # The old conversation id as a whole token: a new id's random hex digits can hold "c0001" by chance.
    assert not re.search(r"(?<!\w)c0001(?!\w)", blob)
    contexts = release_rows(out, "contexts")
    assert "2025-03" in {c["month"] for c in contexts} and all("created" not in c for c in contexts)
    schema = json.loads((out / "schema.json").read_text())
    assert schema["files"]["ratings"]["rows"] == len(ratings) and schema["k"] == 5
    readme = (out / "README.md").read_text()
    assert readme.startswith("---\n") and "config_name: ratings" in readme and "Licence" in readme
    assert store.staff_entries()[-1]["action"] == "release"


def test_the_datasets_loader_reads_the_release(study, tmp_path):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "release"
    assert invoke("release", "--out", out).exit_code == 0
    ratings = datasets.load_dataset(str(out), "ratings", split="train", cache_dir=str(tmp_path / "hf-cache"))
    conversations = datasets.load_dataset(str(out), "conversations", split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert ratings.num_rows == len(release_rows(out, "ratings")) and set(ratings.column_names) >= {"rating", "rater_id"}
    assert conversations.num_rows == len(release_rows(out, "conversations"))


def test_generalization_keeps_what_k_allows_in_a_larger_study(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    data = fill_study(store, 150, 60, seed=11)
    release = build_release(store.rating_data(TAXONOMY), TAXONOMY, k=3)
    raters = release.tables["raters"]
    assert release.suppressed_raters <= 0.1 * len(raters)  # at most 10 % suppressed
    kept = {key for r in raters for key, v in r.items() if key != "rater_id" and v not in (SUPPRESSED, None)}
    assert kept, release.generalization  # something of the traits survives
    combos = Counter(tuple(v for key, v in r.items() if key != "rater_id") for r in raters)
    assert all(n >= 3 or set(combo) == {SUPPRESSED} for combo, n in combos.items())
    assert len(raters) == data.ratings["rater_id"].nunique()  # every rater who rated, no one else


def test_k_anonymity_bands_numbers_then_suppresses():
    import pandas as pd

    raw = pd.DataFrame({"tipi_1": [1, 2, 3, 7, 7, 7], "gender": ["woman"] * 3 + ["man"] * 3},
                       index=[f"r{i}" for i in range(6)])
    frame, levels, suppressed = k_anonymous_traits(raw, TAXONOMY, k=3)
    assert list(frame["tipi_1"]) == ["1-3"] * 3 + ["7"] * 3 and levels["tipi_1"] == 1 and suppressed == 0


def test_check_catches_pii_ids_k_and_counts_without_printing_values(study, tmp_path):
    store, data, secret = study
    out = tmp_path / "release"
    assert invoke("release", "--out", out).exit_code == 0
    originals = originals_from_store(store)

    def broken(edit) -> str:
        copy = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(out, copy)
        edit(copy)
        with pytest.raises(ReleaseError) as info:
            check_release(copy, originals)
        return str(info.value)

    def edit_rows(name, change):
        def edit(folder):
            rows = release_rows(folder, name)
            change(rows)
            (folder / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return edit

    def plant(rows):
        rows[0]["messages"][0]["content"] += " mail leaked.person@corp.example, card 4111 1111 1111 1111, " + secret
    message = broken(edit_rows("conversations", plant))
    assert "(EMAIL)" in message and "(CARD)" in message and "a link secret of the store" in message
    assert "leaked.person" not in message and "4111" not in message and secret not in message

    message = broken(edit_rows("raters", lambda rows: rows[0].update(age_band="18-24", gender="man")))
    assert "shared by fewer than 5" in message
    message = broken(edit_rows("ratings", lambda rows: rows.pop()))
    assert "rows, the schema says" in message and "count of ratings does not match" in message
    message = broken(edit_rows("ratings", lambda rows: rows[0].update(rater_id="r001")))
    assert "a rater id of the store" in message
    assert "r001@example.org" not in message


@pytest.mark.parametrize("case", ["non-empty", "a file", "neither", "both", "k=1"])
def test_release_misuse_is_one_line_and_writes_nothing(study, tmp_path, case):
    target = unusable_target(tmp_path, case)
    args = ["release", "--out", target]
    if case == "neither":
        args = ["release"]
    elif case == "both":
        args += ["--check", tmp_path]
    elif case == "k=1":
        args += ["--k", "1"]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke(*args)
    assert result.exit_code == 2 and result.output.startswith("error: ") and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging folder left either
    if case == "non-empty":
        assert [p.name for p in target.iterdir()] == ["keep.txt"] and "not empty" in result.output


def test_release_without_a_store_and_check_of_a_stranger_folder(tmp_path, monkeypatch):
    for name in ("SENSE7_STORE_URL", "SENSE7_MODEL_DIR", "SENSE7_TAXONOMY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "nohome"))
    result = invoke("release", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "nothing to release" in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "nohome" / "store.sqlite").exists()
    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "schema.json").write_text("{not json")
    for folder, expected in ((tmp_path / "random", "not a sense7 release schema"), (tmp_path / "none", "not a folder")):
        result = invoke("release", "--check", folder)
        assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output


def test_a_failed_verification_leaves_nothing_behind(study, tmp_path):
    store, _, _ = study
    release = build_release(store.rating_data(TAXONOMY), TAXONOMY, k=5)

    def refuse(folder):
        raise ReleaseError("refused")
    with pytest.raises(ReleaseError):
        write_release(release, tmp_path / "out", verify=refuse)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    write_release(release, tmp_path / "out", verify=lambda folder: check_release(folder, Originals()))
    assert (tmp_path / "out" / "README.md").is_file()


# -- release --check reads the whole release (issue 37 item 6) ------------------------------------------------
RATER_EMAIL = "jörg.müller@beispiel.de"  # a rater's own address: an ASCII-only pattern misses it
PLATFORM_ID = "5f3c9a1b2d4e6f708192a3b4"  # a Prolific id, as crowd_completions keeps it


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """One demo-like study with a rater whose e-mail is internationalized and a crowd completion, and its
    release (written by `sense7 release`), shared by the planting tests below (each checks its own copy)."""
    from datetime import datetime, timezone

    from sense7.store.tables import crowd_completions

    root = tmp_path_factory.mktemp("released")
    with pytest.MonkeyPatch.context() as mp:
        store = home_store(root, mp)
        data = fill_study(store, 40, 6)
        secret = LinkBook(store).issue("r001")
        traits = next({k: v for k, v in r.items() if k not in ("rater_id", "email")}
                      for r in data.raters.to_dict("records") if r["rater_id"] == "r002")
        store.upsert_raters([{"rater_id": "r002", "email": RATER_EMAIL, "traits": traits}])
        with store.engine.begin() as conn:
            conn.execute(crowd_completions.insert().values(rater_id="pilot-p0a1b2c3d4e5f60718293", study_id="pilot",
                                                           platform_id=PLATFORM_ID, outcome="completed",
                                                           entered_at=datetime.now(timezone.utc)))
        out = root / "release"
        result = invoke("release", "--out", out)
        assert result.exit_code == 0, result.output
    return root / "home", store, secret, out


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_symlink(), p.lstat().st_mode, p.lstat().st_mtime_ns,
                                         None if p.is_dir() or p.is_symlink() else p.read_bytes())
            for p in [folder, *folder.rglob("*")]}


def _append_to_cell(folder: Path, name: str, line: int, column: str, text: str) -> None:
    """Add text to one cell of csv/NAME.csv (line = the row's line, header = 1)."""
    import csv
    import io

    path = folder / "csv" / f"{name}.csv"
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
    rows[line - 1][rows[0].index(column)] += text
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    path.write_text(buffer.getvalue(), encoding="utf-8")


def _replace_in(folder: Path, rel: str, old: str, new: str) -> None:
    path = folder / rel
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def _plant_message(folder: Path, text: str) -> None:
    rows = release_rows(folder, "conversations")
    rows[0]["messages"][0]["content"] += text
    (folder / "data" / "conversations.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _escape_json(value: str) -> str:
    """Every character of value as a JSON \\u escape: nothing of it readable in the file's bytes."""
    return "".join(f"\\u{ord(c):04x}" for c in value)


# (what was planted, the edit, what the check must say; {secret} and {hash} are the link's)
PLANTED = {
    "an e-mail in csv/conversations.csv": (
        lambda f, s: _append_to_cell(f, "conversations", 2, "content", " mail me: sam.rivers@mail.example"),
        ["csv/conversations.csv:2: content: holds an e-mail address (EMAIL)"], ["sam.rivers"]),
    "a link secret in README.md": (
        lambda f, s: _replace_in(f, "README.md", "## Licence\n", f"## Licence\nAsk {s} for access.\n"),
        ["README.md:", ": section Licence: holds a link secret of the store"], ["{secret}"]),
    "a link secret in schema.json, escaped": (
        lambda f, s: _replace_in(f, "schema.json", '"description": "random id of the conversation',
                                 f'"description": "{_escape_json(s)} random id of the conversation'),
        ["schema.json:", ": files.ratings.columns.conversation_id.description: holds a link secret of the store"],
        ["{secret}"]),
    "a link hash in schema.json": (
        lambda f, s: _replace_in(f, "schema.json", '"k": 5', f'"k": 5, "note": "{token_hash(s)}"'),
        ["schema.json:2: note: holds a link or resume-code hash of the store"], ["{hash}"]),
    "an extra notes.txt": (
        lambda f, s: (f / "notes.txt").write_text("nothing personal\n"),
        ["notes.txt: a file a release does not hold"], []),
    "an extra file holding a link secret": (
        lambda f, s: (f / "csv" / "links.csv").write_text(f"rater_id,url\nr001,http://127.0.0.1:8090/r/{s}\n"),
        ["csv/links.csv: a file a release does not hold", "csv/links.csv:2: holds a link secret of the store",
         "csv/links.csv:2: holds a rater id of the store"], ["{secret}"]),
    "a file deeper in a folder of its own": (
        lambda f, s: ((f / "data" / "old").mkdir(), (f / "data" / "old" / "ratings.jsonl").write_text("{}\n")),
        ["data/old: a folder a release does not hold"], []),
    "a hidden file": (
        lambda f, s: (f / "csv" / ".~lock.raters.csv#").write_text("staff,laptop\n"),
        ["csv/.~lock.raters.csv#: a file a release does not hold"], []),
    "a table replaced by a symbolic link": (
        lambda f, s: ((f / "data" / "raters.jsonl").unlink(),
                      (f / "data" / "raters.jsonl").symlink_to(f.parent / "home" / "store.sqlite")),
        ["data/raters.jsonl: a symbolic link"], []),
    "a store rater id in csv/raters.csv": (
        lambda f, s: _replace_in(f, "csv/raters.csv", "\n" + release_rows(f, "raters")[0]["rater_id"] + ",", "\nr001,"),
        ["csv/raters.csv:2: rater_id: holds a rater id of the store"], []),
    "an original rater id inside a text": (
        lambda f, s: _plant_message(f, " (as r003 told me)"),
        ["data/conversations.jsonl:1: messages[0].content: holds a rater id of the store"], []),
    "an original conversation id inside a text": (
        lambda f, s: _plant_message(f, " see c0007 again"),
        ["data/conversations.jsonl:1: messages[0].content: holds a conversation id of the store"], []),
    "the rater's own internationalized e-mail": (
        lambda f, s: _replace_in(f, "README.md", "## Licence\n", f"## Licence\nWrite to {RATER_EMAIL.upper()}\n"),
        ["section Licence: holds a rater's e-mail of the store", "section Licence: holds an e-mail address (EMAIL)"],
        ["jörg", "JÖRG", "beispiel"]),
    "a stranger's internationalized e-mail in a table": (
        lambda f, s: _plant_message(f, " zoë.ångström@exempel.se"),
        ["data/conversations.jsonl:1: messages[0].content: holds an e-mail address (EMAIL)"], ["zoë", "exempel"]),
    "an e-mail as HTML entities in README.md": (
        lambda f, s: _replace_in(f, "README.md", "## Licence\n", "## Licence\nsam&#46;rivers&#64;mail.example\n"),
        ["section Licence: holds an e-mail address (EMAIL)"], ["rivers"]),
    "an e-mail escaped in the YAML front matter": (
        lambda f, s: _replace_in(f, "README.md", "pretty_name: sense7 study release",
                                 'pretty_name: "sense7 \\x73am\\x40mail.example"'),
        ["README.md:2: front matter: holds an e-mail address (EMAIL)"], ["am@mail"]),
    "a phone number in a CSV": (
        lambda f, s: _append_to_cell(f, "contexts", 3, "task_type", " call +49 30 901820 57"),
        ["csv/contexts.csv:3: task_type: holds a phone number (PHONE)"], ["901820"]),
    "a CSV cell that differs from its table": (
        lambda f, s: _append_to_cell(f, "ratings", 4, "rating", "0"),
        ["csv/ratings.csv:4: rating: differs from data/ratings.jsonl line 3"], []),
    "a platform id": (
        lambda f, s: _append_to_cell(f, "contexts", 2, "month", f" {PLATFORM_ID}"),
        ["csv/contexts.csv:2: month: holds a platform id of the store"], [PLATFORM_ID]),
}


@pytest.mark.parametrize("case", list(PLANTED))
def test_release_check_reads_every_file_and_names_what_it_finds_never_the_value(released, tmp_path, monkeypatch, case):
    """Each plant is refused: exit 2, the finding as file:line: field: kind; the value itself never printed;
    the folder exactly as it was. Today's check read data/*.jsonl only, and no short or non-ASCII id."""
    home, store, secret, out = released
    monkeypatch.setenv("SENSE7_HOME", str(home))
    for name in ("SENSE7_STORE_URL", "SENSE7_MODEL_DIR", "SENSE7_TAXONOMY"):
        monkeypatch.delenv(name, raising=False)
    copy = tmp_path / "release"
    shutil.copytree(out, copy, symlinks=True)
    edit, expected, hidden = PLANTED[case]
    edit(copy, secret)
    before = _snapshot(copy)
    result = invoke("release", "--check", copy)
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "fails its check" in output and "Traceback" not in result.output, result.output
    for phrase in expected:
        assert phrase in output, (phrase, result.output)
    for value in [*hidden, secret, token_hash(secret)]:
        assert value.format(secret=secret, hash=token_hash(secret)) not in result.output, value
    assert _snapshot(copy) == before


def test_a_clean_release_passes_the_whole_check_untouched(released, tmp_path, monkeypatch):
    home, store, secret, out = released
    monkeypatch.setenv("SENSE7_HOME", str(home))
    before = _snapshot(out)
    result = invoke("release", "--check", out)
    assert result.exit_code == 0 and "passes (k=5" in " ".join(result.output.split()), result.output
    assert _snapshot(out) == before
    originals = originals_from_store(store)
    assert RATER_EMAIL in originals.emails and PLATFORM_ID in originals.platform_ids
    assert {"r001", "c0007"} <= originals.rater_ids | originals.conversation_ids


def test_release_out_runs_the_whole_check_before_moving_into_place(study, tmp_path):
    """A store id inside a stored text (the scrub does not know ids) stops `sense7 release`: nothing written."""
    store, data, _ = study
    conv = data.conversations[3]
    store.upsert_conversations([Conversation(conv.conversation_id, conv.rater_id, [
        Message(conv.messages[0].role, conv.messages[0].content + " (r004 said so)"), *conv.messages[1:]],
        conv.context)])
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke("release", "--out", tmp_path / "out")
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "holds a rater id of the store" in output, result.output
    assert "data/conversations.jsonl:" in output and "csv/conversations.csv:" in output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no release, no staging folder
