"""Each rater's own content model: a ridge of what the text model and the rater's leniency and slope leave
unexplained, on a block of the item features, shrunk toward the population (0) with one penalty per control
chosen by cross-validation inside the training data.

For one control, with r(i) the rater of rating i and e_i the residual of the rater effects:
    e_i = (f_i - mean_r) . w_r + noise,      w_r ~ Normal(0, tau2 I)   (ridge penalty alpha = sigma2 / tau2)
The penalty is common to all raters, so a rater's own weights follow from their amount of data: a rater with
a dozen ratings gets weights near 0 (leniency only), one with 1,500 gets what their ratings support. alpha is
chosen from a grid by the squared error of held-out residuals over inner folds grouped by conversation
(training rows only); "no content model" (alpha = inf) is one of the candidates, so the option switches
itself off where it does not predict held-out ratings better.

Each rater's ridge is solved on the smaller of their Gram (p x p) or kernel (n_r x n_r) matrix, one
eigendecomposition giving every penalty of the grid; sparse features (the n-grams) go through the kernel.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.model_selection import GroupKFold

# Penalties tried by inner cross-validation. Feature blocks are scaled so a typical row has unit norm
# (sense7.model.features), so alpha is in "ratings' worth" of evidence: alpha = n_r means the rater's own
# weights are shrunk about halfway toward 0.
ALPHAS = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0)


def _dense_rows(F, rows) -> np.ndarray | sp.csr_matrix:
    block = F[rows]
    return block.tocsr() if sp.issparse(block) else np.asarray(block, dtype=np.float64)


def ridge_path(F, y: np.ndarray, alphas) -> tuple[np.ndarray, np.ndarray]:
    """Ridge of y on F (rows centered, no intercept: the caller's leniency holds it) for every alpha.

    Returns (coef (p, len(alphas)), feature mean (p,)); a prediction for rows G is (G - mean) @ coef."""
    n, p = F.shape
    mean = np.asarray(F.mean(axis=0)).ravel()
    y = np.asarray(y, dtype=np.float64)
    alphas = np.asarray(alphas, dtype=np.float64)
    if p <= n and not sp.issparse(F):
        Fc = F - mean
        s, V = np.linalg.eigh(Fc.T @ Fc)
        s = np.clip(s, 0.0, None)
        proj = V.T @ (Fc.T @ y)  # (p,)
        coef = V @ (proj[:, None] / (s[:, None] + alphas[None, :]))
        return coef, mean
    # Kernel form: coef = Fc' (Fc Fc' + alpha I)^-1 y, with Fc Fc' = H F F' H (H centers the rows).
    K = F @ F.T
    K = K.toarray() if sp.issparse(K) else np.asarray(K)
    row_mean = K.mean(axis=0)
    K = K - row_mean[None, :] - row_mean[:, None] + row_mean.mean()
    s, U = np.linalg.eigh(K)
    s = np.clip(s, 0.0, None)
    yc = y - y.mean()
    proj = U.T @ yc
    dual = U @ (proj[:, None] / (s[:, None] + alphas[None, :]))  # (n, A): sums to ~0 per column
    dual = dual - dual.mean(axis=0)  # exactly centered: then Fc' dual = F' dual
    coef = np.asarray(F.T @ dual)
    return coef, mean


# PersonalizedRater(rater_ridge=...) by name: pooled inner CV, per rater, per rater with the one-SE rule.
RATER_RIDGE_CHOICES = ("cv", "cv_rater", "cv_rater_1se")


def beats_off_by_one_se(squared: np.ndarray, column: int) -> bool:
    """The one-standard-error rule for one rater: squared (rows, candidates + 1) held-out squared errors, the
    last column "off". True when `column` beats off on these rows by more than the standard error of the
    mean difference (rows differ a lot in how much content helps them; a rater whose gain is within its own
    noise keeps leniency only)."""
    gain = squared[:, -1] - squared[:, column]
    if len(gain) < 2:
        return False
    return bool(gain.mean() > gain.std(ddof=1) / np.sqrt(len(gain)))


class RaterResidualRidge:
    """Per-rater ridge weights on one control's residuals; arrays only (the estimator maps ids to rows).

    alpha: a penalty, or None to choose one from `alphas` (plus "off") by inner cross-validation.
    per_rater: with alpha None, each rater's penalty is chosen from the same candidates on their own
    held-out rows (raters differ in how much content moves them; a rater with few held-out ratings then
    decides on few, which is why it is not the default); alpha_ is then the pooled choice, alphas_ each
    rater's. one_se (with per_rater): a rater gets weights only when they beat "off" by more than one
    standard error (beats_off_by_one_se).
    After fit: coef_ (p, raters) float32 (zeros for raters without weights), offset_ (raters,) = mean_r .
    w_r, alpha_ (np.inf = off), cv_error_ {alpha: mean squared held-out error} and oof_ (the training rows'
    held-out predictions under alpha_, what a new rating of a known rater gets: the known link is fitted
    on them)."""

    def __init__(self, alpha: float | None = None, alphas=ALPHAS, n_folds: int = 3, min_ratings: int = 3,
                 per_rater: bool = False, one_se: bool = False):
        self.one_se = one_se
        self.per_rater = per_rater
        self.alpha = alpha
        self.alphas = alphas
        self.n_folds = n_folds
        self.min_ratings = min_ratings

    def _fit_raters(self, F, rater_rows, e, rows, alphas):
        """{rater: (coef (p, A), mean)} fitted on `rows` (indices into F / e)."""
        out = {}
        by_rater = rater_rows[rows]
        for r in np.unique(by_rater):
            mine = rows[by_rater == r]
            if len(mine) < self.min_ratings:
                continue
            out[int(r)] = ridge_path(_dense_rows(F, mine), e[mine], alphas)
        return out

    def fit(self, F, rater_rows: np.ndarray, e: np.ndarray, groups: np.ndarray, n_raters: int):
        """F: (n, p) features of the rated rows (sparse or dense); rater_rows: each row's rater (0..R-1);
        e: the residual to explain; groups: each row's conversation (the inner folds group by it)."""
        rater_rows = np.asarray(rater_rows)
        e = np.asarray(e, dtype=np.float64)
        n, p = F.shape
        alphas = np.asarray([self.alpha] if self.alpha is not None else self.alphas, dtype=np.float64)
        n_groups = len(np.unique(groups))
        folds = list(GroupKFold(n_splits=min(self.n_folds, n_groups)).split(np.zeros(n), groups=groups)) \
            if n_groups >= 2 else []
        held_out = np.zeros((n, len(alphas)))
        for train, test in folds:
            fitted = self._fit_raters(F, rater_rows, e, train, alphas)
            for r, (coef, mean) in fitted.items():
                mine = test[rater_rows[test] == r]
                if len(mine):
                    held_out[mine] = _dense_rows(F, mine) @ coef - mean @ coef
        errors = ((e[:, None] - held_out) ** 2).mean(axis=0) if n else np.zeros(len(alphas))
        off_error = float(np.mean(e ** 2)) if n else 0.0
        self.cv_error_ = {float(a): float(err) for a, err in zip(alphas, errors)}
        self.cv_error_[float("inf")] = off_error
        best = int(np.argmin(errors)) if len(alphas) else 0
        # A fixed alpha is used as given; a chosen one only if it beats no content model on held-out rows.
        use = self.alpha is not None or (len(folds) > 0 and errors[best] < off_error)
        self.coef_ = np.zeros((p, n_raters), dtype=np.float32)
        self.offset_ = np.zeros(n_raters)
        self.oof_ = np.zeros(n)
        self.alpha_ = float("inf")
        self.alphas_ = np.full(n_raters, np.inf)
        if not use:
            return self
        self.alpha_ = float(alphas[best])
        choice = np.full(n_raters, best)  # index into alphas; len(alphas) = off
        if self.per_rater and self.alpha is None:
            squared = np.column_stack([(e[:, None] - held_out) ** 2, e ** 2])
            for r in range(n_raters):
                mine = rater_rows == r
                if mine.any():
                    choice[r] = int(np.argmin(squared[mine].mean(axis=0)))
                    if self.one_se and choice[r] < len(alphas) and not beats_off_by_one_se(squared[mine], choice[r]):
                        choice[r] = len(alphas)
        on = choice < len(alphas)
        self.alphas_[on] = alphas[choice[on]]
        if folds:
            own = choice[np.clip(rater_rows, 0, None)]
            self.oof_ = np.where(own < len(alphas), held_out[np.arange(n), np.minimum(own, len(alphas) - 1)], 0.0)
        fitted = self._fit_raters(F, rater_rows, e, np.arange(n), alphas)
        for r, (coef, mean) in fitted.items():
            if on[r]:
                self.coef_[:, r] = coef[:, choice[r]]
                self.offset_[r] = float(mean @ coef[:, choice[r]])
        return self

    def predict(self, F, rater_rows: np.ndarray) -> np.ndarray:
        """The content shift of each row for its rater (rater_rows < 0: unknown rater, 0)."""
        rater_rows = np.asarray(rater_rows)
        out = np.zeros(F.shape[0])
        if not np.isfinite(self.alpha_):
            return out
        for r in np.unique(rater_rows[rater_rows >= 0]):
            mine = np.flatnonzero(rater_rows == r)
            out[mine] = np.asarray(F[mine] @ self.coef_[:, r]).ravel() - self.offset_[r]
        return out
