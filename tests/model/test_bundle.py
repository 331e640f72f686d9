"""The served bundle: kinds per item, vectorised predictions, and saves a crash can never half-finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sense7.model.bundle import BUNDLE_FILE, TEMP_PREFIX, BundleError, load_bundle, save_bundle, train_bundle
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


@pytest.fixture(scope="module")
def bundle(small_synth):
    return train_bundle(small_synth.rating_data(), "v1", TAXONOMY)


def test_predict_items_kinds_and_values(bundle, small_items):
    X, _ = small_items
    X = X.iloc[:30].copy()
    trait_cols = [c for c in X.columns if c.startswith("trait_")]
    X.loc[X.index[10:20], "rater_id"] = "newcomer"  # traits known, no ratings
    X.loc[X.index[20:30], "rater_id"] = "stranger"
    X.loc[X.index[20:30], trait_cols] = np.nan  # nothing known
    preds = bundle.predict_items(X)
    assert [p.kind for p in preds] == ["personalized"] * 10 + ["traits"] * 10 + ["generic"] * 10
    assert bundle.controls == list(preds[0].controls) and bundle.levels == [1, 2, 3, 4, 5]
    # Each kind's numbers are exactly its model's.
    np.testing.assert_allclose(preds[25].controls["overall"].probs,
                               bundle.generic.predict_proba(X.iloc[[25]])["overall"][0])
    np.testing.assert_allclose(preds[5].controls["tone"].probs,
                               bundle.personalized.predict_proba(X.iloc[[5]])["tone"][0])
    assert preds[15].controls["overall"].probs.tolist() != preds[25].controls["overall"].probs.tolist()
    assert bundle.metrics["n_raters"] == len(bundle.known_raters)
    assert set(X["rater_id"].iloc[:10]) <= bundle.known_raters and "newcomer" not in bundle.known_raters


def test_save_load_round_trip(bundle, small_items, tmp_path):
    X, _ = small_items
    path = save_bundle(bundle, tmp_path / "models")
    assert path == tmp_path / "models" / BUNDLE_FILE
    loaded = load_bundle(tmp_path / "models")
    assert loaded.version == "v1"
    for a, b in zip(bundle.predict_items(X.iloc[:20]), loaded.predict_items(X.iloc[:20])):
        assert a.kind == b.kind
        np.testing.assert_array_equal(a.controls["overall"].probs, b.controls["overall"].probs)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [BUNDLE_FILE]  # no temp file left


def test_failed_save_keeps_the_previous_bundle(bundle, tmp_path, monkeypatch):
    save_bundle(bundle, tmp_path)
    import joblib

    def crash(obj, fh):
        fh.write(b"\x80\x04partial pickle")
        raise OSError("disk full")

    monkeypatch.setattr(joblib, "dump", crash)
    with pytest.raises(OSError, match="disk full"):
        save_bundle(bundle, tmp_path)
    assert load_bundle(tmp_path).version == "v1"
    assert [p.name for p in tmp_path.iterdir()] == [BUNDLE_FILE]


def test_killed_writer_never_exposes_a_partial_bundle(bundle, tmp_path):
    """A writer process is SIGKILLed half-way through writing v2: readers still get v1, never v2's half,
    and the leftover temp file is not mistaken for a bundle."""
    save_bundle(bundle, tmp_path)
    script = textwrap.dedent(f"""
        import sys, time, joblib
        from sense7.model.bundle import load_bundle, save_bundle
        bundle = load_bundle({str(tmp_path)!r})
        bundle.version = "v2"
        real_dump = joblib.dump
        def slow_dump(obj, fh):
            import io
            buffer = io.BytesIO()
            real_dump(obj, buffer)
            data = buffer.getvalue()
            fh.write(data[: len(data) // 2])
            fh.flush()
            print("HALF", flush=True)
            time.sleep(60)
            fh.write(data[len(data) // 2:])
        joblib.dump = slow_dump
        save_bundle(bundle, {str(tmp_path)!r})
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "HALF"
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]
        assert len(temps) == 1 and temps[0].stat().st_size > 0  # the half-written v2 is on disk
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert load_bundle(tmp_path).version == "v1"
    with pytest.raises(BundleError):
        load_bundle(temps[0])  # the partial file itself is unreadable, and load_bundle says so


def test_load_rejects_missing_and_foreign_files(tmp_path):
    with pytest.raises(BundleError, match="no model bundle"):
        load_bundle(tmp_path)
    import joblib

    joblib.dump({"not": "a bundle"}, tmp_path / BUNDLE_FILE)
    with pytest.raises(BundleError, match="not a ModelBundle"):
        load_bundle(tmp_path)


def test_bundle_covers_the_whole_scale_even_unused_levels():
    synth = generate(15, 3, seed=2, taxonomy=TAXONOMY)
    data = synth.rating_data()
    controls = data.ratings["dimension"] != "expectation_met"
    data.ratings.loc[controls, "rating"] = data.ratings.loc[controls, "rating"].clip(lower=2)  # nobody gave 1
    bundle = train_bundle(data, "v9", TAXONOMY)
    assert bundle.levels == [1, 2, 3, 4, 5]
    from sense7.data.items import build_items

    X, _ = build_items(data, TAXONOMY)
    assert bundle.predict_items(X.iloc[:2])[0].controls["overall"].probs.shape == (5,)
