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
    """Ridge of rater-level targets on traits (first column unpenalised).

    The penalty is chosen against what the raters were *observed* to do, not against their EM posterior
    means: a rater with two ratings has a posterior that is almost the trait prediction itself, so scoring
    the traits on posteriors confirms whatever the traits say (on WASSA it trusted them in folds where they
    ranked held-out raters backwards). `choose_alpha` scores each penalty by the exact leave-one-rater-out
    error on the raters' mean residuals, each weighted by its precision 1 / (tau2 + sigma2 / n_ratings).
    """

    def __init__(self, Z: np.ndarray, alphas):
        p = Z.shape[1]
        self.penalty = np.eye(p)
        self.penalty[0, 0] = 0.0
        self.Z = Z
        self.alphas = np.asarray(alphas, dtype=float)
        self.gram = Z.T @ Z

    def choose_alpha(self, observed: np.ndarray, weight: np.ndarray) -> float:
        """The penalty with the least precision-weighted leave-one-rater-out error on `observed`
        (raters with weight 0, i.e. no ratings, are left out)."""
        has = weight > 0
        Z, y, w = self.Z[has], observed[has], weight[has]
        if len(y) < 3:
            return float(self.alphas.max())  # too few raters to learn from traits: intercept only
        Zw = Z * w[:, None]
        best_alpha, best_err = float(self.alphas.max()), np.inf
        for alpha in self.alphas:
            solve = np.linalg.pinv(Z.T @ Zw + alpha * self.penalty) @ Zw.T
            leverage = np.clip(1 - np.einsum("ij,ji->i", Z, solve), 1e-6, None)
            err = float((w * ((y - Z @ (solve @ y)) / leverage) ** 2).sum())
            if err < best_err:
                best_alpha, best_err = float(alpha), err
        return best_alpha

    def fit(self, M: np.ndarray, alpha: float) -> np.ndarray:
        return np.linalg.solve(self.gram + alpha * self.penalty + 1e-9 * np.eye(len(self.gram)), self.Z.T @ M)


class RaterEffects:
    """EM fit of the mixed model above for one control; arrays only (the estimator maps ids to rows)."""

    def __init__(self, slopes: bool = True, n_iter: int = 40, alphas=(0.3, 1, 3, 10, 30, 100, 300, 1000, 1e4, 1e6),
                 noise_prior: float | None = None):
        self.slopes = slopes
        self.noise_prior = noise_prior
        self.n_iter = n_iter
        self.alphas = alphas

    def _design(self, g: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        n_extra = getattr(self, "n_extra_", 0)  # models fitted before rater directions existed: none
        d = np.ones((len(g), (2 if self.slopes else 1) + n_extra))
        if self.slopes:
            d[:, 1] = g - self.g_mean_
        if n_extra:
            d[:, -n_extra:] = extra
        return d

    def fit(self, rater_rows: np.ndarray, Z: np.ndarray, g: np.ndarray, e: np.ndarray,
            extra: np.ndarray | None = None):
        """rater_rows: each item's row in Z (R, p: intercept column first); g: text score; e: y - g.
        extra: (n, r) item values of r more directions, each with a rater-specific slope under the same
        trait prior and shrinkage as the intercept (two raters with the same leniency can differ in
        what moves them); None: none."""
        R = Z.shape[0]
        self.g_mean_ = float(np.mean(g))
        self.n_extra_ = 0 if extra is None else int(np.shape(extra)[1])
        D = self._design(g, extra)
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
        # What each rater was observed to do (mean residual), to score the trait penalty on (see _TraitRidge).
        observed = np.bincount(rater_rows, weights=e, minlength=R) / np.maximum(counts, 1)
        rater_sigma2 = np.full(R, sigma2)
        for _ in range(self.n_iter):
            mu = Z @ W
            T_inv = np.linalg.inv(T)
            precision = A / rater_sigma2[:, None, None] + T_inv[None]
            cov = np.linalg.inv(precision)
            rhs = v / rater_sigma2[:, None] + mu @ T_inv.T
            m = np.einsum("rij,rj->ri", cov, rhs)
            # How much each rater's observed mean says about their leniency (0: no ratings).
            mean_precision = np.where(counts > 0, 1 / (T[0, 0] + rater_sigma2 / np.maximum(counts, 1)), 0.0)
            self.trait_alpha_ = trait_ridge.choose_alpha(observed, mean_precision)
            W = trait_ridge.fit(m, self.trait_alpha_)
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
        # Each rater's sufficient statistics (sum of D'D and of D'e over their ratings): with the population
        # parameters above they give the rater's posterior again, plus any later ratings (sense7.model.live_posterior).
        self.rater_gram_, self.rater_moment_ = A, v
        # Sufficient statistics for leave-one-out posteriors (loo_posterior); dropped by `compact`.
        self._loo_stats = (A, v, Z @ W)
        return self

    def loo_posterior(self, rater_rows: np.ndarray, g: np.ndarray, e: np.ndarray,
                      extra: np.ndarray | None = None) -> np.ndarray:
        """For the training rows: each row's rater coefficients estimated without that row, i.e. what a
        new rating of a known rater gets. Links fitted on these are not overconfident (on in-sample
        posteriors a rater with 2 ratings looks twice as predictable as it is)."""
        A, v, prior_mean = self._loo_stats
        D = self._design(g, extra)
        A_loo = A[rater_rows] - D[:, :, None] * D[:, None, :]
        v_loo = v[rater_rows] - D * e[:, None]
        s2 = self.rater_sigma2_[rater_rows]
        T_inv = np.linalg.inv(self.T_)
        precision = A_loo / s2[:, None, None] + T_inv[None]
        rhs = v_loo / s2[:, None] + prior_mean[rater_rows] @ T_inv.T
        return np.linalg.solve(precision, rhs[:, :, None])[:, :, 0]

    def compact(self) -> "RaterEffects":
        """Drop what only fitting needs (keeps saved bundles small)."""
        self._loo_stats = None
        return self

    def prior(self, Z: np.ndarray) -> np.ndarray:
        return Z @ self.W_

    def design(self, g: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """(n, k) each rating's row of the random-effect design: 1 (and g - g_mean with slopes, and the
        rater directions' columns `extra` when the model has them)."""
        return self._design(np.asarray(g, dtype=float), extra)

    def posterior(self, gram: np.ndarray, moment: np.ndarray, prior_mean: np.ndarray,
                  sigma2: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, precision) of one rater's coefficients with the population parameters fixed (the EM's
        E-step): gram = sum of D'D and moment = sum of D'e over the rater's ratings (zeros: none), prior_mean
        = what their traits predict (`prior`), sigma2 = their noise variance (default: the pooled one)."""
        s2 = self.sigma2_ if sigma2 is None else float(sigma2)
        T_inv = np.linalg.inv(self.T_)
        precision = np.asarray(gram, dtype=float) / s2 + T_inv
        rhs = np.asarray(moment, dtype=float) / s2 + T_inv @ np.asarray(prior_mean, dtype=float)
        return np.linalg.solve(precision, rhs), precision

    def adjust(self, g: np.ndarray, coef: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """The rater-specific shift of the text score g for per-item coefficients coef (n, k)."""
        return (self._design(g, extra) * coef).sum(axis=1)


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
