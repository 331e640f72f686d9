"""Per-rater effects with partial pooling toward what the rater's traits predict.

For one control, the residual of the text model e = y - g is modelled as
    e_i = a_r + b_r * (g_i - g_mean) + noise,      (a_r, b_r) ~ Normal(W' [1, z_r], T)
a random intercept (leniency) and, optionally, a random slope (how strongly the rater reacts to what the
text model sees), whose prior mean is a ridge regression on the rater's standardized traits z_r. W, T and
the noise variance are fitted by EM (a linear mixed model), so how much a rater's own ratings move them
away from the trait prediction follows from the data: 2 ratings barely move a rater, 200 consistent ones
dominate, and a rater with no ratings gets the trait prediction alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


class _TraitRidge:
    """Ridge of rater-level targets on traits (first column unpenalised), alpha per target by exact
    leave-one-rater-out error. The traits are fixed during EM, so the solves are precomputed once."""

    def __init__(self, Z: np.ndarray, alphas):
        p = Z.shape[1]
        penalty = np.eye(p)
        penalty[0, 0] = 0.0
        self.Z = Z
        self.alphas = np.asarray(alphas, dtype=float)
        self.solvers = []  # (alpha, (Z'Z + alpha P)^-1 Z', leverage)
        for alpha in self.alphas:
            solve = np.linalg.pinv(Z.T @ Z + alpha * penalty) @ Z.T
            self.solvers.append((solve, np.clip(1 - np.einsum("ij,ji->i", Z, solve), 1e-6, None)))

    def fit(self, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        best_w = np.zeros((self.Z.shape[1], M.shape[1]))
        best_alpha = np.zeros(M.shape[1])
        best_err = np.full(M.shape[1], np.inf)
        for alpha, (solve, one_minus_h) in zip(self.alphas, self.solvers):
            W = solve @ M
            err = (((M - self.Z @ W) / one_minus_h[:, None]) ** 2).mean(axis=0)
            better = err < best_err
            best_err[better], best_w[:, better], best_alpha[better] = err[better], W[:, better], alpha
        return best_w, best_alpha


class RaterEffects:
    """EM fit of the mixed model above for one control; arrays only (the estimator maps ids to rows)."""

    def __init__(self, slopes: bool = True, n_iter: int = 40, alphas=(0.3, 1, 3, 10, 30, 100, 300, 1000, 1e4, 1e6),
                 noise_prior: float | None = None):
        self.slopes = slopes
        self.noise_prior = noise_prior
        self.n_iter = n_iter
        self.alphas = alphas

    def _design(self, g: np.ndarray) -> np.ndarray:
        d = np.ones((len(g), 2 if self.slopes else 1))
        if self.slopes:
            d[:, 1] = g - self.g_mean_
        return d

    def fit(self, rater_rows: np.ndarray, Z: np.ndarray, g: np.ndarray, e: np.ndarray):
        """rater_rows: each item's row in Z (R, p: intercept column first); g: text score; e: y - g."""
        R = Z.shape[0]
        self.g_mean_ = float(np.mean(g))
        D = self._design(g)
        k = D.shape[1]
        A = np.zeros((R, k, k))
        np.add.at(A, rater_rows, D[:, :, None] * D[:, None, :])
        v = np.zeros((R, k))
        np.add.at(v, rater_rows, D * e[:, None])
        ss = np.bincount(rater_rows, weights=e ** 2, minlength=R)
        n = len(e)
        var_e = float(np.var(e)) if n > 1 else 1.0
        sigma2 = max(var_e, 1e-4)
        T = np.diag([0.5 * sigma2] + [0.05] * (k - 1))
        W = np.zeros((Z.shape[1], k))
        trait_ridge = _TraitRidge(Z, self.alphas)
        counts = np.bincount(rater_rows, minlength=R).astype(float)
        rater_sigma2 = np.full(R, sigma2)
        for _ in range(self.n_iter):
            mu = Z @ W
            T_inv = np.linalg.inv(T)
            precision = A / rater_sigma2[:, None, None] + T_inv[None]
            cov = np.linalg.inv(precision)
            rhs = v / rater_sigma2[:, None] + mu @ T_inv.T
            m = np.einsum("rij,rj->ri", cov, rhs)
            W, self.trait_alpha_ = trait_ridge.fit(m)
            dev = m - Z @ W
            T = (np.einsum("ri,rj->ij", dev, dev) + cov.sum(axis=0)) / R
            T = T + np.eye(k) * 1e-6
            if not self.slopes:
                T = np.atleast_2d(T)
            resid = ss - 2 * np.einsum("ri,ri->r", m, v) + np.einsum("ri,rij,rj->r", m, A, m) \
                + np.einsum("rij,rji->r", A, cov)
            sigma2 = max(float(resid.sum() / max(n, 1)), 1e-4)
            if self.noise_prior is None:
                rater_sigma2 = np.full(R, sigma2)
            else:
                # Raters differ in consistency too (one always gives 7, another uses the whole scale):
                # a per-rater noise variance, shrunk toward the pooled one with noise_prior pseudo-ratings.
                rater_sigma2 = np.maximum((resid + self.noise_prior * sigma2) / (counts + self.noise_prior), 1e-4)
        self.W_, self.T_, self.sigma2_, self.posterior_ = W, T, sigma2, m
        self.rater_sigma2_ = rater_sigma2
        return self

    def prior(self, Z: np.ndarray) -> np.ndarray:
        return Z @ self.W_

    def adjust(self, g: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """The rater-specific shift of the text score g for per-item coefficients coef (n, k)."""
        return (self._design(g) * coef).sum(axis=1)


def assistant_keys(X) -> np.ndarray:
    """The `assistant_id` column of an item frame as strings, None where unknown (or no such column)."""
    out = np.full(len(X), None, dtype=object)
    if "assistant_id" not in getattr(X, "columns", ()):
        return out
    column = X["assistant_id"]
    known = column.notna().to_numpy()
    if known.any():
        text = column[known].astype(str).str.strip().to_numpy(dtype=object)
        text[text == ""] = None
        out[known] = text
    return out


class AssistantEffects:
    """A random intercept per rated assistant (the *ratee*: a model version, or in WASSA the other person),
    shrunk toward 0 by empirical Bayes: e_i = u_a + noise, u_a ~ Normal(0, tau2). tau2 and the noise
    variance are fitted by EM on the training residuals, so an assistant with 2 ratings moves little and
    one with 50 consistent ratings moves almost by its mean residual; unknown / unseen assistants get 0.
    """

    def __init__(self, n_iter: int = 50):
        self.n_iter = n_iter

    def fit(self, keys: np.ndarray, e: np.ndarray):
        keys = np.asarray(keys, dtype=object)
        e = np.asarray(e, dtype=float)
        known = np.array([k is not None for k in keys], dtype=bool) & np.isfinite(e)
        uniques = pd.unique(keys[known])
        self.index_ = pd.Index(uniques, dtype=object)
        codes = self.index_.get_indexer(keys[known])
        A = len(uniques)
        counts = np.bincount(codes, minlength=A).astype(float)
        sums = np.bincount(codes, weights=e[known], minlength=A)
        self.counts_ = counts
        n = int(known.sum())
        if A == 0 or n < 2:
            self.tau2_, self.sigma2_, self.effect_ = 0.0, 1.0, np.zeros(A)
            return self
        sigma2 = max(float(np.var(e[known])), 1e-4)
        tau2 = 0.1 * sigma2
        ss = float(np.sum(e[known] ** 2))
        for _ in range(self.n_iter):
            post_var = 1.0 / (counts / sigma2 + 1.0 / tau2)
            m = post_var * sums / sigma2
            tau2 = max(float(np.mean(m ** 2 + post_var)), 1e-6)
            resid = ss - 2 * np.sum(m * sums) + np.sum(counts * (m ** 2 + post_var))
            sigma2 = max(float(resid / n), 1e-4)
        self.tau2_, self.sigma2_ = tau2, sigma2
        self.effect_ = sums / (counts + sigma2 / tau2)
        self.sums_ = sums
        return self

    def effect(self, keys: np.ndarray) -> np.ndarray:
        """The shrunk effect of each item's assistant; 0 for unknown or unseen assistants."""
        rows = self.index_.get_indexer(np.asarray(keys, dtype=object)) if len(self.index_) else \
            np.full(len(keys), -1)
        out = np.zeros(len(keys))
        out[rows >= 0] = self.effect_[rows[rows >= 0]]
        return out

    def loo_effect(self, keys: np.ndarray, e: np.ndarray) -> np.ndarray:
        """For the training rows: each row's assistant effect estimated without that row (what a new
        rating of a known assistant gets), so links fitted on these scores are not overconfident."""
        keys = np.asarray(keys, dtype=object)
        e = np.asarray(e, dtype=float)
        out = np.zeros(len(keys))
        if not len(self.index_) or self.tau2_ <= 0:
            return out
        rows = self.index_.get_indexer(keys)
        ok = (rows >= 0) & np.isfinite(e)
        r = rows[ok]
        out[ok] = (self.sums_[r] - e[ok]) / (self.counts_[r] - 1 + self.sigma2_ / self.tau2_)
        return out
