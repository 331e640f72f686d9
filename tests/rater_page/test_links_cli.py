"""`sense7 raters invite|revoke`: one private link per rater in a 0600 CSV, only hashes in the store,
re-runs keep links, --rotate replaces them, revocation is immediate, bad input changes nothing."""

from __future__ import annotations

import csv
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook

SENSE7 = str(Path(sys.executable).parent / "sense7")


def _run(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")}
    env.update(SENSE7_HOME=str(tmp_path / "home"), SENSE7_STORE_URL=f"sqlite:///{tmp_path / 'store.sqlite'}")
    return subprocess.run([SENSE7, *args], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)


def _rows(path: Path) -> dict[str, dict]:
    with path.open() as fh:
        return {row["rater_id"]: row for row in csv.DictReader(fh)}


@pytest.mark.slow  # four sense7 processes
def test_invite_keep_rotate_and_revoke(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.upsert_raters([{"rater_id": "r1", "email": "r1@x.test", "traits": {}},
                         {"rater_id": "r2", "traits": {}}])
    out = tmp_path / "links.csv"
    done = _run(tmp_path, "raters", "invite", "--no-copy-queues", "--out", str(out), "--base-url", "https://rate.example.org/")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    first = _rows(out)
    assert set(first) == {"r1", "r2"} and first["r1"]["email"] == "r1@x.test" and first["r2"]["email"] == ""
    tokens = {r: row["url"].rsplit("/r/", 1)[1] for r, row in first.items()}
    assert all(row["url"].startswith("https://rate.example.org/r/") for row in first.values())
    assert len(set(tokens.values())) == 2 and all(len(t) >= 40 for t in tokens.values())
    book = LinkBook(store)
    assert {r: book.rater_for(t) for r, t in tokens.items()} == {"r1": "r1", "r2": "r2"}
    # Read by another process: closing a file descriptor of the database in this one would drop SQLite's
    # POSIX locks for the store's open connection (and with them its view of later writes).
    files = [str(p) for p in tmp_path.glob("store.sqlite*")]
    database = subprocess.run(["cat", *files], capture_output=True, check=True, timeout=60).stdout
    assert not any(t.encode() in database for t in tokens.values())  # only hashes are stored

    store.upsert_raters([{"rater_id": "r3", "traits": {}}])
    assert _run(tmp_path, "raters", "invite", "--no-copy-queues", "--out", str(out)).returncode == 0
    again = _rows(out)
    assert {r: again[r]["url"] for r in ("r1", "r2")} == {r: first[r]["url"] for r in ("r1", "r2")}  # kept
    assert book.rater_for(again["r3"]["url"].rsplit("/r/", 1)[1]) == "r3"

    rotate = _run(tmp_path, "raters", "invite", "--no-copy-queues", "--out", str(out), "--rotate", "--rater", "r1")
    assert rotate.returncode == 0, rotate.stderr
    rotated = _rows(out)
    assert rotated["r1"]["url"] != first["r1"]["url"] and rotated["r2"]["url"] == first["r2"]["url"]
    assert book.rater_for(tokens["r1"]) is None and book.rater_for(rotated["r1"]["url"].rsplit("/r/", 1)[1]) == "r1"

    assert _run(tmp_path, "raters", "revoke", "r2").returncode == 0
    assert book.rater_for(tokens["r2"]) is None
    refused = _run(tmp_path, "raters", "revoke", "r2")
    assert refused.returncode == 1 and "no active link" in refused.stderr


@pytest.mark.slow  # a `sense7` command in a process of its own
def test_an_unknown_rater_is_named_and_nothing_changes(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.upsert_raters([{"rater_id": "r1", "traits": {}}])
    before = store.snapshot()
    out = tmp_path / "links.csv"
    done = _run(tmp_path, "raters", "invite", "--no-copy-queues", "--out", str(out), "--rater", "r1", "--rater", "nobody")
    assert done.returncode == 1 and "nobody" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and store.snapshot() == before
