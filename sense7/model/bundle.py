"""What the ML backend serves: a generic and a personalized rater model trained together, with metadata.

`save_bundle` writes atomically: the bundle goes to a temporary file in the target directory, is flushed
and fsynced, then renamed over `bundle.joblib` with os.replace (atomic on POSIX). A reader therefore sees
either the previous complete file or the new complete file, never a half-written one; temporary files
left by a killed writer are never read.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import joblib
import numpy as np
import pandas as pd

from sense7.data.dataset import RatingData
from sense7.data.items import build_items
from sense7.files import fsync_dir
from sense7.model.estimators import GenericRater, PersonalizedRater, controls_from_proba
from sense7.taxonomy import Taxonomy

BUNDLE_FILE = "bundle.joblib"
TEMP_PREFIX = ".bundle-"
KINDS = ("personalized", "traits", "generic")


class BundleError(RuntimeError):
    """The path holds no complete, loadable bundle."""


@dataclass(slots=True)
class ItemPrediction:
    kind: str  # personalized (rater had ratings in training), traits (traits only), generic (unknown rater)
    controls: dict  # control -> ControlPrediction


@dataclass
class ModelBundle:
    # The two model fields stay fixed rather than coming from sense7.model.catalog: a bundle is pickled
    # (joblib) into the model registry and loaded by the ML backend, CompiledBundle (sense7.model.serving)
    # compiles exactly these two estimators, and kinds()/predict_items route rows between them. A
    # catalog-driven {name: model} field would change the served format and strand bundles already on
    # disk. The catalog decides what is *evaluated*; the bundle is what is *served* (catalog kinds
    # "generic" and "personalized").
    version: str
    controls: list
    levels: list
    generic: GenericRater
    personalized: PersonalizedRater
    known_raters: frozenset
    metrics: dict = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)

    def kinds(self, X: pd.DataFrame) -> np.ndarray:
        """Which model answers each row (see ItemPrediction.kind)."""
        known = X["rater_id"].astype(str).isin(self.known_raters).to_numpy()
        present = [c for c in self.personalized.trait_columns_ if c in X.columns]
        has_traits = X[present].notna().any(axis=1).to_numpy() if present else np.zeros(len(X), dtype=bool)
        return np.where(known, "personalized", np.where(has_traits, "traits", "generic"))

    def compile(self):
        """The serving predictor of this bundle (sense7.model.serving.CompiledBundle): the same predictions
        from Label Studio task columns, with the per-call overhead of predict_items gone."""
        from sense7.model.serving import CompiledBundle

        return CompiledBundle(self)

    def predict_items(self, X: pd.DataFrame) -> list[ItemPrediction]:
        """One ItemPrediction per row of X. Each model is called once on all of its rows."""
        kinds = self.kinds(X)
        kind_names = kinds.tolist()
        levels = np.asarray(self.levels)
        out: list[ItemPrediction | None] = [None] * len(X)
        use_generic = kinds == "generic"
        for model, rows in ((self.personalized, np.flatnonzero(~use_generic)),
                            (self.generic, np.flatnonzero(use_generic))):
            if not len(rows):
                continue
            per_row = controls_from_proba(model.predict_proba(X.iloc[rows]), levels)
            for row, controls in zip(rows.tolist(), per_row):
                out[row] = ItemPrediction(kind_names[row], controls)
        return out


def train_bundle(data: RatingData, version: str, taxonomy: Taxonomy,
                 generic: GenericRater | None = None, personalized: PersonalizedRater | None = None,
                 personalized_params: dict | None = None) -> ModelBundle:
    """Fit both models on all of `data` (evaluation is sense7.research.evaluation's job, on held-out folds).
    personalized_params: parameters of the default personalized model (sense7.model.options.served_params)."""
    tax = taxonomy
    X, Y = build_items(data, tax)
    if not len(X):
        raise ValueError("no rated items to train on")
    started = time.perf_counter()
    if personalized is None:
        # Taxonomy controls are served on the taxonomy's whole scale, even a level nobody used yet.
        in_taxonomy = set(Y.columns) <= set(tax.controls)
        personalized = PersonalizedRater(levels=list(range(1, tax.levels + 1)) if in_taxonomy else None,
                                         **(personalized_params or {}))
    personalized = personalized.fit(X, Y)
    # The default generic model is the personalized model's own text part: one text fit, not two.
    generic = generic.fit(X, Y) if generic is not None else personalized.to_generic()
    metrics = {
        "n_items": int(len(X)),
        "n_ratings": int(Y.notna().sum().sum()),
        "n_raters": int(X["rater_id"].nunique()),
        "n_conversations": int(X["conversation_id"].nunique()),
        "fit_seconds": round(time.perf_counter() - started, 3),
    }
    return ModelBundle(version=str(version), controls=list(personalized.controls_),
                       levels=[int(v) for v in personalized.levels_], generic=generic, personalized=personalized,
                       known_raters=frozenset(str(r) for r in personalized.known_raters_), metrics=metrics)


def save_bundle(bundle: ModelBundle, model_dir) -> Path:
    """Write `model_dir/bundle.joblib` atomically; returns its path."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    final = model_dir / BUNDLE_FILE
    fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=model_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            joblib.dump(bundle, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(model_dir)  # make the rename itself durable
    return final


def load_bundle(path) -> ModelBundle:
    """Load a bundle from its file or from the directory save_bundle wrote to."""
    path = Path(path)
    if path.is_dir():
        path = path / BUNDLE_FILE
    if not path.is_file():
        raise BundleError(f"{path}: no model bundle here")
    try:
        bundle = joblib.load(path)
    except Exception as exc:  # corrupt or truncated: never serve it
        raise BundleError(f"{path}: cannot load the model bundle ({type(exc).__name__}: {exc})") from None
    if not isinstance(bundle, ModelBundle):
        raise BundleError(f"{path}: holds a {type(bundle).__name__}, not a ModelBundle")
    return bundle
