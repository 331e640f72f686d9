"""`sense7 crowd init|open|close|status|completions`: a bad study file is one clear error per problem
(file:line: field) with nothing stored; completions is the only export of platform ids, written 0600."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sense7.crowd.lifecycle import start_rating
from sense7.crowd.participants import Participants, Studies
from sense7.store.database import Store
from tests.support.crowd import write_study

SENSE7 = Path(sys.executable).parent / "sense7"


def _run(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")}
    env.update({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.db'}"})
    return subprocess.run([str(SENSE7), *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a `sense7` command in a process of its own
def test_a_bad_study_file_names_file_line_and_field_and_stores_nothing(tmp_path):
    path = write_study(tmp_path / "s", extra="colour: blue\n")
    text = path.read_text().replace("answer: 2", "answer: 9").replace("lease_minutes: 60", "lease_minutes: soon")
    path.write_text(text)
    done = _run(tmp_path, "crowd", "init", str(path))
    assert done.returncode == 2
    assert f"{path}:9: comprehension[2].answer: must be the number of the right choice (1-2)" in done.stderr
    assert f"{path}:12: lease_minutes:" in done.stderr and f"{path}:20: colour: unknown setting" in done.stderr
    assert "nothing was imported" in done.stderr and "Traceback" not in done.stderr
    assert Studies(Store(f"sqlite:///{tmp_path / 'store.db'}")).ids() == []


@pytest.mark.slow
def test_init_open_status_and_completions_0600_with_completed_participants_only(tmp_path):
    path = write_study(tmp_path / "s")
    init = _run(tmp_path, "crowd", "init", str(path))
    assert init.returncode == 0, init.stderr
    assert "PROLIFIC_PID={{%PROLIFIC_PID%}}" in init.stdout
    assert stat.S_IMODE((tmp_path / "home" / "secrets" / "crowd_pilot").stat().st_mode) == 0o600
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    assert Studies(store).get("pilot")[1] is False
    assert _run(tmp_path, "crowd", "open", "pilot").returncode == 0 and Studies(store).get("pilot")[1] is True
    study = Studies(store).get("pilot")[0]
    participants = Participants(store, study)
    for rater, pid in [("pilot-pa", "PIDDONE1"), ("pilot-pb", "PIDHALF2")]:
        participants.agree(rater, {"platform_id": pid, "platform_study": "S1", "platform_session": "X"})
        start_rating(store, study, rater)
    participants.move("pilot-pa", "rating", "completed")
    out = tmp_path / "completions.csv"
    done = _run(tmp_path, "crowd", "completions", "pilot", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    body = out.read_text()
    assert "PIDDONE1" in body and "PIDHALF2" not in body
    status = _run(tmp_path, "crowd", "status")
    # (the console wraps the line at the terminal's width: compare it with its whitespace collapsed)
    assert "1 completed, 1 rating" in " ".join(status.stdout.split()) and "PID" not in status.stdout
    assert "assignment least_covered (floor 1):" in " ".join(status.stdout.split())
    assert _run(tmp_path, "crowd", "close", "nosuch").returncode == 2


@pytest.mark.slow
def test_a_turn_budget_study_is_described_and_a_budget_below_the_longest_conversation_refused(tmp_path):
    good = _run(tmp_path, "crowd", "init", str(write_study(tmp_path / "s", turns=3, budget=7)))
    assert good.returncode == 0, good.stderr
    assert "a budget of 7 turns each" in good.stdout.replace("\n", " ")
    short = write_study(tmp_path / "t", turns=3, budget=2, study="short")
    bad = _run(tmp_path, "crowd", "init", str(short))
    assert bad.returncode == 2
    assert f"{short}:11: turns_per_participant: must be at least the longest conversation's assistant turns" \
        in bad.stderr.replace("\n", " ")
    assert "nothing was imported" in bad.stderr and "Traceback" not in bad.stderr
    assert Studies(Store(f"sqlite:///{tmp_path / 'store.db'}")).ids() == ["pilot"]
