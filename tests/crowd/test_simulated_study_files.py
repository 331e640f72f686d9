"""The simulated study's files (demo and bench) hold conversation data and payment codes: owner only."""

from __future__ import annotations

import stat

from sense7.crowd.simulate import write_study
from sense7.synthetic.toy_study import make_conversations


def test_the_study_files_are_the_owners_only(tmp_path):
    pool = make_conversations(["pool"], per_rater=2, turns=1, prefix="t")
    path = write_study(tmp_path / "study", pool, study_id="s", participants=3, k=2, n=1, lease_minutes=1,
                       codes={"completion": "C", "no_consent": "N", "screen_out": "S"})
    assert stat.S_IMODE((tmp_path / "study").stat().st_mode) == 0o700
    for name in ("study.yaml", "consent.md", "pool.jsonl"):
        assert stat.S_IMODE((path.parent / name).stat().st_mode) == 0o600, name
    assert len((path.parent / "pool.jsonl").read_text().splitlines()) == 2
    assert "completion: C" in path.read_text()
