"""A tiny stand-in bundle for contract tests: deterministic, picklable, instant to load.

It follows the served-bundle contract of DESIGN.md (`compile()` -> a predictor with `controls`,
`rater_table(traits)` and `predict(columns, table) -> Predictions`), so the HTTP contract can be tested in
milliseconds; tests/backend/test_served_model.py and the integration test serve real trained bundles.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sense7.model.serving import Predictions
from sense7.taxonomy import load_taxonomy

CONTROLS = load_taxonomy().controls


@dataclass
class FakeBundle:
    version: str
    level: int = 3  # every control predicts this level (so a test can tell versions apart)
    known_raters: tuple = ()
    controls: list = field(default_factory=lambda: list(CONTROLS))
    metrics: dict = field(default_factory=dict)
    fail_for: str | None = None  # a rater id whose items make predict raise

    def compile(self) -> "FakePredictor":
        return FakePredictor(self)


class FakePredictor:
    def __init__(self, bundle: FakeBundle):
        self.bundle = bundle
        self.controls = list(bundle.controls)

    def rater_table(self, traits):
        """Raters with at least one known trait (the real one also holds their coefficients)."""
        return set(traits.index[traits.notna().any(axis=1)].astype(str)) if len(traits.columns) else set()

    def predict(self, columns: dict, with_traits: set) -> Predictions:
        raters = [str(r) for r in columns["rater_id"]]
        if self.bundle.fail_for in raters:
            raise ValueError("cannot predict this item")
        kinds = ["personalized" if r in self.bundle.known_raters else "traits" if r in with_traits else "generic"
                 for r in raters]
        probs = np.full((len(raters), len(self.controls), 5), 0.1)
        probs[:, :, self.bundle.level - 1] = 0.6
        return Predictions(kinds, probs, np.arange(1, 6))


def save_fake(bundle: FakeBundle, path: Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "bundle.pkl").write_bytes(pickle.dumps(bundle))


def load_fake(path: Path) -> FakeBundle:
    return pickle.loads((Path(path) / "bundle.pkl").read_bytes())
