"""Many weighted ridge regressions on one sparse matrix at once.

The text model needs, per control, a fit on all training rows plus one per cross-validation fold (for
out-of-fold scores). They all share the design matrix and differ only in which rows count (the weights),
so one conjugate-gradient run over a (features x fits) block does them together: every iteration is two
sparse-times-dense products instead of dozens of sparse-times-vector products in separate scikit-learn fits.
"""

from __future__ import annotations

import numpy as np


def multi_ridge(F, targets: np.ndarray, weights: np.ndarray, alpha, tol: float = 1e-5,
                max_iter: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """Solve min_b sum_i w_ik (y_ik - b0_k - F_i b_k)^2 + alpha_k |b_k|^2 for every column k.

    F: sparse (n, p); targets, weights: (n, K) (a weight of 0 leaves the row out; NaN targets must have
    weight 0); alpha: one penalty, or one per column (K,). Returns coef (p, K) and intercept (K,), the
    intercept unpenalised (the fit is centered).
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    W = np.asarray(weights, dtype=np.float64)
    Y = np.where(W > 0, np.nan_to_num(targets, nan=0.0), 0.0)
    total = W.sum(axis=0)
    total = np.where(total > 0, total, 1.0)
    y_mean = (W * Y).sum(axis=0) / total
    FT = F.T.tocsr()
    x_mean = np.asarray(FT @ W) / total  # (p, K): weighted feature means per fit

    def apply(V):
        r = np.asarray(F @ V) - (x_mean * V).sum(axis=0)
        r *= W
        return np.asarray(FT @ r) - x_mean * r.sum(axis=0) + alpha * V

    rhs_rows = W * (Y - y_mean)
    B = np.asarray(FT @ rhs_rows) - x_mean * rhs_rows.sum(axis=0)
    V = np.zeros_like(B)
    R = B.copy()
    P = R.copy()
    rs = (R * R).sum(axis=0)
    stop = (tol ** 2) * np.maximum((B * B).sum(axis=0), 1e-30)
    for _ in range(max_iter):
        active = rs > stop
        if not active.any():
            break
        AP = apply(P)
        denom = (P * AP).sum(axis=0)
        step = np.where(active & (denom > 0), rs / np.where(denom > 0, denom, 1.0), 0.0)
        V += step * P
        R -= step * AP
        rs_new = (R * R).sum(axis=0)
        P = R + np.where(rs > 0, rs_new / np.where(rs > 0, rs, 1.0), 0.0) * P
        rs = rs_new
    intercept = y_mean - (x_mean * V).sum(axis=0)
    return V, intercept
