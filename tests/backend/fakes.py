"""A tiny stand-in bundle for contract tests: deterministic, picklable, instant to load.

It follows the ModelBundle contract of DESIGN.md (`predict_items(X) -> [ItemPrediction(kind, controls)]`),
so the HTTP contract can be tested in milliseconds; the integration test serves a real trained bundle.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sense7.model.estimators import ControlPrediction
from sense7.taxonomy import load_taxonomy

CONTROLS = load_taxonomy().controls


@dataclass
class FakeItemPrediction:
    kind: str
    controls: dict


@dataclass
class FakeBundle:
    version: str
    level: int = 3  # every control predicts this level (so a test can tell versions apart)
    known_raters: tuple = ()
    controls: list = field(default_factory=lambda: list(CONTROLS))
    metrics: dict = field(default_factory=dict)
    fail_for: str | None = None  # a rater id whose items make predict_items raise

    def predict_items(self, X):
        if self.fail_for is not None and (X["rater_id"] == self.fail_for).any():
            raise ValueError("cannot predict this item")
        out = []
        trait_cols = [c for c in X.columns if c.startswith("trait_")]
        for _, row in X.iterrows():
            if row["rater_id"] in self.known_raters:
                kind = "personalized"
            elif trait_cols and row[trait_cols].notna().any():
                kind = "traits"
            else:
                kind = "generic"
            probs = np.full(5, 0.1)
            probs[self.level - 1] = 0.6
            out.append(FakeItemPrediction(kind, {c: ControlPrediction(probs, float(self.level), self.level, 0.6)
                                                 for c in self.controls}))
        return out


def save_fake(bundle: FakeBundle, path: Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "bundle.pkl").write_bytes(pickle.dumps(bundle))


def load_fake(path: Path) -> FakeBundle:
    return pickle.loads((Path(path) / "bundle.pkl").read_bytes())
