"""From a continuous score to calibrated probabilities over ordered levels: a cumulative-logit link.

P(y <= level_k | s) = sigmoid((theta_k - s) / scale), thresholds increasing. K parameters (first
threshold, log gaps, log scale) fitted by maximum likelihood (analytic gradient) on (score, rating) pairs
whose scores the score's model did not overfit (out-of-fold text scores).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

GAP_PRIOR = 1e-3  # keeps never-seen levels from pushing thresholds to infinity
MAX_FIT_POINTS = 4000  # K parameters need far fewer points; more only costs fit time


class OrdinalLink:
    def __init__(self, levels):
        self.levels = np.asarray(levels, dtype=float)

    def _unpack(self, params):
        k = len(self.levels)
        gaps = params[1:k - 1]
        thresholds = params[0] + np.concatenate([[0.0], np.cumsum(np.exp(gaps))])
        return thresholds, np.exp(params[k - 1])

    def _loss_and_grad(self, params, scores, idx, weight):
        k = len(self.levels)
        thresholds, scale = self._unpack(params)
        n = len(scores)
        a = (thresholds[None, :] - scores[:, None]) / scale  # (n, k-1)
        cum = expit(a)
        dens = cum * (1 - cum)
        # Pad with the boundaries P(y <= below lowest) = 0 and P(y <= highest) = 1 (no gradient there).
        zeros, ones = np.zeros((n, 1)), np.ones((n, 1))
        cum_p = np.hstack([zeros, cum, ones])
        dens_p = np.hstack([zeros, dens, zeros])
        a_p = np.hstack([zeros, a, zeros])
        rows = np.arange(n)
        p = np.clip(cum_p[rows, idx + 1] - cum_p[rows, idx], 1e-12, None)
        loss = -(weight * np.log(p)).sum() + GAP_PRIOR * np.sum(params[1:k - 1] ** 2)
        # d log p / d theta_j for the thresholds above (idx+1) and below (idx) the observed level.
        g_theta = np.zeros((n, k + 1))
        g_theta[rows, idx + 1] += dens_p[rows, idx + 1] / (scale * p)
        g_theta[rows, idx] -= dens_p[rows, idx] / (scale * p)
        g_theta = (weight[:, None] * g_theta[:, 1:k]).sum(axis=0)  # (k-1,)
        g_log_scale = (weight * (-a_p[rows, idx + 1] * dens_p[rows, idx + 1]
                                 + a_p[rows, idx] * dens_p[rows, idx]) / p).sum()
        grad = np.empty_like(params)
        grad[0] = g_theta.sum()
        gaps = params[1:k - 1]
        # theta_j = first + sum_{m < j} exp(gap_m): gap_m moves every threshold above it.
        tail = np.cumsum(g_theta[::-1])[::-1]  # tail[j] = sum_{i >= j} g_theta[i]
        grad[1:k - 1] = np.exp(gaps) * tail[1:] if k > 2 else []
        grad[k - 1] = g_log_scale
        grad = -grad
        grad[1:k - 1] += 2 * GAP_PRIOR * gaps
        return loss, grad

    def fit(self, scores, y, sample_weight=None):
        scores = np.asarray(scores, dtype=float)
        idx = np.searchsorted(self.levels, np.asarray(y, dtype=float))
        weight = np.ones(len(scores)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        if len(scores) > MAX_FIT_POINTS:  # an evenly spaced subsample: deterministic, no seed needed
            keep = np.linspace(0, len(scores) - 1, MAX_FIT_POINTS).astype(int)
            scores, idx, weight = scores[keep], idx[keep], weight[keep]
        mids = (self.levels[:-1] + self.levels[1:]) / 2
        # Start: thresholds half-way between levels, the score being on the rating scale.
        start = np.concatenate([[mids[0]], np.log(np.maximum(np.diff(mids), 1e-3)), [np.log(0.5)]])
        result = minimize(self._loss_and_grad, start, args=(scores, idx, weight), jac=True, method="L-BFGS-B")
        self.params_ = result.x
        return self

    def thresholds_and_scale(self) -> tuple[np.ndarray, float]:
        return self._unpack(self.params_)

    def predict_proba(self, scores) -> np.ndarray:
        thresholds, scale = self._unpack(self.params_)
        return cumulative_logit_proba(thresholds, scale, scores)


def cumulative_logit_proba(thresholds, scale, scores) -> np.ndarray:
    """P(each level) for `scores` of shape (...), thresholds (..., K-1) and scale (...) broadcasting on the
    leading axes: one link (thresholds (K-1,), scores (n,)) or one link per control at once (thresholds
    (C, K-1), scale (C,), scores (n, C)), as the serving path uses it."""
    scores = np.asarray(scores, dtype=float)
    cum = expit((np.asarray(thresholds, dtype=float) - scores[..., None]) / np.asarray(scale, dtype=float)[..., None])
    if not cum.shape[-1]:  # one level: certain
        return np.ones(cum.shape[:-1] + (1,))
    # The differences of (0, cum..., 1) along the last axis, written in place: the same subtractions as
    # np.diff of the padded array (cum - 0.0 is cum), without building it (a served request makes 1-3 calls).
    probs = np.empty(cum.shape[:-1] + (cum.shape[-1] + 1,))
    probs[..., 0] = cum[..., 0]
    np.subtract(cum[..., 1:], cum[..., :-1], out=probs[..., 1:-1])
    np.subtract(1.0, cum[..., -1], out=probs[..., -1])
    np.maximum(probs, 1e-9, out=probs)  # np.clip(probs, 1e-9, None)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs
