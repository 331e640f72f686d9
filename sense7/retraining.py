"""Retrain the rater models and promote a new version only when it is not worse than the served one.

The held-out slice is chosen by a stable hash of the conversation id (about `holdout_fraction` of the
conversations), so it is the same slice at every retrain: no version, served or candidate, was ever
trained on it, which makes "not worse on that slice" a fair comparison. The promoted model is the one
trained on the other conversations; its metrics (and those of the served version and of a majority-class
baseline on the same slice) are recorded with the version.

Artifacts go through sense7.model.registry (staging directory + rename, manifest written last, atomic
CURRENT pointer), so a run killed mid-retrain leaves the served version untouched. Running one retrain at a
time is the caller's job (the jobs' Redis lock, sense7.tasks.training).
"""

from __future__ import annotations

import hashlib
import logging
import math
import shutil
import time
from dataclasses import dataclass, replace

import pandas as pd

from sense7.model.registry import STAGING_PREFIX, ModelRegistry, RegistryError
from sense7.model.vector_cache import VectorCache, cached_encoder, with_vector_cache
from sense7.privacy.participation import Withdrawals, drop_left_out
from sense7.research.metrics import macro_metrics, point_metrics
from sense7.taxonomy import Taxonomy

log = logging.getLogger(__name__)


class RetrainBusy(RuntimeError):
    """Another retrain holds the lock."""


def holdout_conversations(conversation_ids, fraction: float = 0.2) -> set[str]:
    """Conversations whose stable hash falls under `fraction` (at least one when there are two or more)."""
    ids = sorted(set(map(str, conversation_ids)))

    def bucket(cid: str) -> float:
        return int(hashlib.sha256(cid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    held = {cid for cid in ids if bucket(cid) < fraction}
    if not held and len(ids) >= 2:
        held = {min(ids, key=bucket)}
    if len(held) == len(ids) and ids:
        held.discard(max(held, key=bucket))
    return held


def subset(data, conversation_ids: set[str], keep: bool):
    """The RatingData restricted to (keep=True) or without (keep=False) the given conversations."""
    from sense7.data.dataset import RatingData

    mask = data.ratings["conversation_id"].isin(conversation_ids)
    ratings = data.ratings[mask if keep else ~mask].reset_index(drop=True)
    convs = {k: v for k, v in data.conversations.items() if (k[0] in conversation_ids) == keep}
    return RatingData(conversations=convs, ratings=ratings, raters=data.raters)


def score_bundle(bundle, X: pd.DataFrame, Y: pd.DataFrame, levels) -> dict:
    """Per-control and macro metrics of a bundle's served predictions on (X, Y)."""
    preds = bundle.predict_items(X)
    per_control = {}
    for control in Y.columns:
        rated = Y[control].notna().to_numpy()
        if not rated.any():
            continue
        chosen = [p.controls.get(control) for p, r in zip(preds, rated) if r]
        if any(c is None for c in chosen):
            continue  # the bundle does not predict this control
        metrics = point_metrics(Y[control].to_numpy()[rated], [c.level for c in chosen],
                                [c.expected for c in chosen], levels)
        per_control[control] = {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
                                for k, v in metrics.items()}
    return {"macro": macro_metrics(per_control, undefined=None), "per_control": per_control, "n_items": int(len(X))}


def score_baseline(X_train, Y_train, X, Y, levels) -> dict:
    """The trivial baseline every report must show: the majority level of the training slice."""
    from sense7.model.baselines import MajorityClass

    model = MajorityClass().fit(X_train, Y_train)
    pred = model.predict(X)
    expected = model.predict_expected(X)
    per_control = {}
    for control in Y.columns:
        rated = Y[control].notna().to_numpy()
        if not rated.any() or control not in pred:
            continue
        metrics = point_metrics(Y[control].to_numpy()[rated], pred[control].to_numpy()[rated],
                                expected[control].to_numpy()[rated], levels)
        per_control[control] = {k: (None if isinstance(v, float) and math.isnan(v) else float(v))
                                for k, v in metrics.items()}
    return {"macro": macro_metrics(per_control, undefined=None), "per_control": per_control}


def _primary(metrics: dict | None) -> float:
    """The number versions are compared by: macro Spearman (undefined counts as 0, i.e. no ranking)."""
    if not metrics:
        return float("-inf")
    value = metrics["macro"].get("spearman")
    return 0.0 if value is None else float(value)


def gate_scores(metrics: dict | None) -> tuple[float | None, float | None]:
    """(candidate, served) held-out scores the promotion gate compared, from a version's recorded metrics
    (`Retrainer.run`); None where absent (no served version to beat, or metrics of another kind)."""
    metrics = metrics or {}
    candidate = _primary(metrics.get("holdout")) if metrics.get("holdout") else None
    served = _primary(metrics.get("served_on_holdout")) if metrics.get("served_on_holdout") else None
    return candidate, served


@dataclass
class RetrainResult:
    status: str           # "promoted" | "kept" (candidate worse) | "skipped"
    version: str | None
    serving: str | None   # the version serving after this run
    reason: str
    metrics: dict | None = None

    def as_dict(self) -> dict:
        return {"status": self.status, "version": self.version, "serving": self.serving,
                "reason": self.reason, "metrics": self.metrics}


class Retrainer:
    """Train on the store's ratings, compare with the served version on the held-out slice, promote."""

    def __init__(self, store, registry: ModelRegistry, taxonomy: Taxonomy, holdout_fraction: float = 0.2,
                 keep_versions: int = 5, tolerance: float = 0.0, min_items: int = 10, quality=None,
                 personalized_params: dict | None = None):
        self.store = store
        # Parameters of the personalized model beyond the defaults (sense7.model.options.served_params):
        self.personalized_params = dict(personalized_params or {})
        self.quality = quality  # sense7.research.quality.QualityPolicy: flagged raters left out; None = keep all
        self.registry = registry
        self.taxonomy = taxonomy
        self.holdout_fraction = holdout_fraction
        self.keep_versions = keep_versions
        self.tolerance = tolerance
        self.min_items = min_items

    def vectors(self) -> VectorCache:
        """The store's text vectors (sense7.model.vector_cache): a text encoder reads them, computing only texts
        no process embedded before. One cache per retrainer: the candidate's fit and the served version's
        scoring share its LRU."""
        if getattr(self, "_vectors", None) is None:
            self._vectors = VectorCache.of_store(self.store)
        return self._vectors

    def fit_params(self) -> dict:
        """personalized_params with a text encoder (SENSE7_MODEL_TEXT_ENCODER) reading the store's text vectors."""
        params = dict(self.personalized_params)
        if params.get("text_encoder") is not None:
            params["text_encoder"] = cached_encoder(params["text_encoder"], self.vectors())
        return params

    def clean_staging(self) -> list[str]:
        """Remove staging directories: while we hold the retrain lock, any staging directory is debris
        of a killed run (the registry only ever renames complete ones into place)."""
        removed = []
        if self.registry.model_dir.is_dir():
            for path in self.registry.model_dir.iterdir():
                if path.is_dir() and path.name.startswith(STAGING_PREFIX):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path.name)
        return removed

    def remove_withdrawn_versions(self) -> list[str]:
        """Delete the versions trained on erased raters' data (sense7.privacy.participation's receipts) that are
        not served; the served one goes once a new version replaces it."""
        withdrawals = Withdrawals(self.store)
        stale = withdrawals.versions_to_remove()
        current = self.registry.current()
        removed = [v for v in sorted(stale) if v != current]
        for version in removed:
            self.registry.remove(version)
        if removed:
            withdrawals.mark_removed(set(removed))
        return removed

    def _excluded_raters(self) -> set[str]:
        """Raters the quality policy leaves out of training (flagged, with training = "exclude")."""
        if self.quality is None or self.quality.training != "exclude":
            return set()
        from sense7.research.study_analysis import flagged_weights

        return {rater for rater, weight in flagged_weights(self.store, self.quality).items() if weight == 0}

    def run(self, reason: str = "manual") -> RetrainResult:
        from sense7.data.items import build_items
        from sense7.model.bundle import train_bundle

        self.clean_staging()
        serving = self.registry.current()
        # Conversations their participants left out of the study are never trained on.
        data = drop_left_out(self.store.rating_data(self.taxonomy), self.store)
        withdrawn = Withdrawals(self.store).versions_to_remove()  # trained on erased raters' data
        self.remove_withdrawn_versions()
        excluded = self._excluded_raters()
        if excluded:
            data = replace(data, ratings=data.ratings[~data.ratings["rater_id"].isin(excluded)])
        if data.ratings.empty:
            return RetrainResult("skipped", None, serving, "no ratings in the store yet")
        held = holdout_conversations(data.ratings["conversation_id"], self.holdout_fraction)
        train, test = subset(data, held, keep=False), subset(data, held, keep=True)
        X_train, Y_train = build_items(train, self.taxonomy)
        if len(X_train) < self.min_items or not held:
            return RetrainResult("skipped", None, serving,
                                 f"too few rated items to train and hold out ({len(X_train)} training items)")
        X_test, Y_test = build_items(test, self.taxonomy)
        Y_test = Y_test.reindex(columns=[c for c in Y_train.columns if c in Y_test.columns])
        version = self.registry.next_version()
        started = time.perf_counter()
        bundle = train_bundle(train, version, self.taxonomy, personalized_params=self.fit_params())
        train_seconds = time.perf_counter() - started
        levels = list(range(1, self.taxonomy.levels + 1))
        candidate = score_bundle(bundle, X_test, Y_test, levels)
        served = None
        if serving and serving not in withdrawn:  # a version trained on erased data is replaced whatever it scores
            try:
                served = score_bundle(with_vector_cache(self.registry.load(serving), self.vectors()), X_test, Y_test,
                                      levels)
            except RegistryError as exc:
                log.warning("served version %s cannot be scored (%s): the candidate replaces it", serving, exc)
        baseline = score_baseline(X_train, Y_train, X_test, Y_test, levels)
        promote = served is None or _primary(candidate) >= _primary(served) - self.tolerance
        metrics = {
            "reason": reason, "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "train_seconds": round(train_seconds, 3), "n_train_items": int(len(X_train)),
            "n_train_ratings": int(len(train.ratings)), "n_holdout_conversations": len(held),
            "holdout": candidate, "served_on_holdout": served and {"version": serving, **served},
            "baseline_majority": baseline, "promoted": promote, "bundle": dict(bundle.metrics or {}),
            "excluded_raters": len(excluded), "personalized_params": self.personalized_params,
        }
        bundle.metrics = metrics
        self.registry.add(bundle, version, metrics)
        if promote:
            self.registry.promote(version)
        self.registry.prune(self.keep_versions)
        self.remove_withdrawn_versions()
        now_serving = self.registry.current()
        why = (f"held-out macro Spearman {_primary(candidate):.3f} vs served "
               f"{'none' if served is None else f'{_primary(served):.3f}'}")
        return RetrainResult("promoted" if promote else "kept", version, now_serving, why, metrics)
