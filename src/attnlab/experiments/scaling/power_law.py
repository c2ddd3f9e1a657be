"""The scaling law ``L(x) = E + A x^-alpha`` and its fit, vectorised over many problems at once
(the bootstrap's replicates are fitted together).

Why this estimator. Kaplan et al. (2020) fit pure power laws ``L = (x_c / x)^alpha`` by least
squares in log-log space; with an irreducible term ``E`` the curve is no longer a line there, and
Hoffmann et al. (2022, approach 3) fit ``E + A N^-alpha`` by minimising a Huber loss of the
residuals of ``log L``. We take approach 3's objective, for three reasons: residuals in log space
weigh a 1% miss equally at every size (the noise of a run's loss is roughly proportional to the
loss), ``log`` keeps the prediction positive, and Huber's loss keeps one bad rung from bending the
curve. The threshold ``delta`` differs from Hoffmann's 1e-3 (tuned to their hundreds of runs):
by default it is 1.345 x the seed noise of one run (:class:`~.settings.FitSettings`), the classical
choice that is 95% as efficient as least squares when the noise is Gaussian and down-weights
points further out. ``loss = "squares"`` gives plain least squares on ``log L``.

The minimiser is Levenberg-Marquardt with iteratively reweighted least squares for the Huber
weights (``w = min(1, delta / |r|)``) instead of Hoffmann's L-BFGS: three parameters and a few
dozen points make each step a 3 x 3 solve, and the steps of a thousand replicates run as one
batched numpy operation. Both minimise the same objective; a step is kept only if it lowers it.
Like Hoffmann's, the search starts from a grid of initial values (150 points over ``E``, ``A``,
``alpha``) and keeps the best end point, since the objective has flat valleys (``A`` against
``alpha``) and a floor at ``E -> 0``.

Parametrisation: ``theta = (e, a, alpha)`` with ``E = exp(e)``, ``A = exp(a) x_ref^alpha``, so
``log L = logaddexp(e, a - alpha log(x / x_ref))``; ``x_ref`` (the geometric mean of the rung
sizes) keeps ``a`` of order one whatever the units of x. ``alpha`` is held in ``[0, alpha_max]``
and ``E`` in ``[1e-6, max L]``. Cost per iteration: O(B P) for B problems of P points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: bounds of theta = (e, a, alpha) beyond alpha's own: E in [1e-6, max L], exp(a) in [1e-8, 1e8]
E_FLOOR = 1e-6
A_RANGE = (1e-8, 1e8)
#: the grid of starting points: fractions of the smallest loss (E), of the largest (exp(a)), alpha
E_FRACTIONS = (0.02, 0.3, 0.6, 0.85, 0.97)
A_FRACTIONS = (0.003, 0.03, 0.3, 1.0, 3.0)
ALPHAS = (0.05, 0.15, 0.3, 0.6, 1.0, 1.6)
MAX_ITERS = 100


@dataclass(frozen=True)
class PowerLaw:
    """``L(x) = E + A x^-alpha``."""

    E: float
    A: float
    alpha: float

    def __call__(self, x: float | np.ndarray) -> np.ndarray:
        return self.E + self.A * np.asarray(x, dtype=np.float64) ** -self.alpha

    def describe(self, var: str = "N") -> str:
        return f"L({var}) = {self.E:.4g} + {self.A:.4g} {var}^-{self.alpha:.4g}"


def objective(r: np.ndarray, mask: np.ndarray, loss: str, delta: float) -> np.ndarray:
    """Sum over points of 0.5 r^2 (``squares``) or Huber's rho(r) (0.5 r^2 inside ``delta``,
    ``delta (|r| - delta / 2)`` outside), over the last axis."""
    a = np.abs(r)
    rho = (
        0.5 * r * r
        if loss == "squares"
        else np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))
    )
    return np.where(mask, rho, 0.0).sum(axis=-1)


def _model(theta: np.ndarray, lu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log L [.., P] and its Jacobian [.., P, 3] in theta, for log(x / x_ref) = ``lu``."""
    e, a, al = theta[..., 0:1], theta[..., 1:2], theta[..., 2:3]
    t = a - al * lu
    f = np.logaddexp(e, t)
    s_e, s_a = np.exp(e - f), np.exp(t - f)
    return f, np.stack([s_e, s_a, -lu * s_a], axis=-1)


def _clip(theta: np.ndarray, e_hi: np.ndarray, alpha_max: float) -> np.ndarray:
    out = theta.copy()
    out[..., 0] = np.clip(out[..., 0], math.log(E_FLOOR), e_hi)
    out[..., 1] = np.clip(out[..., 1], math.log(A_RANGE[0]), math.log(A_RANGE[1]))
    out[..., 2] = np.clip(out[..., 2], 0.0, alpha_max)
    return out


def _pinned(theta: np.ndarray, g: np.ndarray, e_hi: np.ndarray, alpha_max: float) -> np.ndarray:
    """[B, 3] coordinates at a bound whose descent direction ``g`` points out of the box: the
    step leaves them there and moves the others (a projected step that only clipped them would
    crawl along the bound)."""
    lo = np.array([math.log(E_FLOOR), math.log(A_RANGE[0]), 0.0])
    hi = np.stack(
        [e_hi, np.full_like(e_hi, math.log(A_RANGE[1])), np.full_like(e_hi, alpha_max)], axis=-1
    )
    return ((theta <= lo + 1e-12) & (g < 0)) | ((theta >= hi - 1e-12) & (g > 0))


def _grid(y: np.ndarray, mask: np.ndarray, alpha_max: float) -> np.ndarray:
    """[B, G, 3] starting points scaled to each problem's losses."""
    lo = np.where(mask, y, np.inf).min(axis=-1)
    hi = np.where(mask, y, -np.inf).max(axis=-1)
    alphas = sorted({min(a, alpha_max) for a in ALPHAS})
    g = np.array(
        [
            (math.log(fe), math.log(fa), al)
            for fe in E_FRACTIONS
            for fa in A_FRACTIONS
            for al in alphas
        ]
    )
    out = np.broadcast_to(g, (y.shape[0], *g.shape)).copy()
    out[..., 0] += lo[:, None]
    out[..., 1] += hi[:, None]
    return out


def _levenberg_marquardt(
    theta: np.ndarray,
    lu: np.ndarray,
    y: np.ndarray,
    mask: np.ndarray,
    *,
    loss: str,
    delta: float,
    e_hi: np.ndarray,
    alpha_max: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the objective from each row of ``theta`` [B, 3]; returns (theta, objective).

    A row stops when a step changes its objective by less than 1e-12 of it (the floor of float64
    arithmetic), moves it less than 1e-10, or its damping passes 1e10 (no step lowers the
    objective), or after ``MAX_ITERS`` (a well-posed ladder converges in a few dozen; a
    degenerate one, e.g. flat losses, crawls along its valley and is flagged by the checks of
    :mod:`.trust` whatever its end point); only the rows still moving are computed."""
    theta = _clip(theta, e_hi, alpha_max)
    f, J = _model(theta, lu)
    obj = objective(y - f, mask, loss, delta)
    lam = np.full(theta.shape[0], 1e-3)
    live = np.arange(theta.shape[0])
    eye = np.eye(3)
    for _ in range(MAX_ITERS):
        if live.size == 0:
            break
        th, fl, Jl, yl, ml = theta[live], f[live], J[live], y[live], mask[live]
        r = yl - fl
        w = ml if loss == "squares" else ml * np.minimum(1.0, delta / np.maximum(np.abs(r), 1e-300))
        H = np.einsum("bpi,bp,bpj->bij", Jl, w, Jl)
        g = np.einsum("bpi,bp,bp->bi", Jl, w, r)
        pin = _pinned(th, g, e_hi[live], alpha_max)  # at a bound and pushed out: held there
        H = np.where(pin[:, :, None] | pin[:, None, :], 0.0, H) + pin[:, :, None] * eye
        g = np.where(pin, 0.0, g)
        damp = lam[live, None, None] * (H * eye + 1e-12 * eye)
        step = np.linalg.solve(H + damp, g[..., None])[..., 0]
        cand = _clip(th + step, e_hi[live], alpha_max)
        f_c, J_c = _model(cand, lu[live])
        obj_c = objective(yl - f_c, ml, loss, delta)
        better = obj_c < obj[live]
        moved = np.abs(cand - th).max(axis=-1)
        keep = live[better]
        theta[keep], f[keep], J[keep], obj[keep] = (
            cand[better],
            f_c[better],
            J_c[better],
            obj_c[better],
        )
        lam[live] = np.where(better, lam[live] / 3.0, lam[live] * 4.0)
        flat = np.abs(obj_c - obj[live]) <= 1e-12 * obj[live] + 1e-300
        done = (flat & ~better) | (lam[live] > 1e10) | (better & (moved < 1e-10))
        live = live[~done]
    return theta, obj


def fit_power_laws(
    x: np.ndarray,
    y: np.ndarray,
    mask: np.ndarray,
    *,
    x_ref: float,
    loss: str = "huber",
    delta: float = 1e-3,
    alpha_max: float = 2.0,
    starts: np.ndarray | None = None,
    keep: int = 3,
) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``log L = log(E + A x^-alpha)`` to B problems at once.

    ``x``, ``y`` (log-losses), ``mask`` are [B, P] (or [P] for one problem); ``starts`` [B, 3]
    adds a starting point per problem (a warm start) to the ``keep`` best grid points. Returns
    ``params`` [B, 3] as (E, A, alpha) and the objective [B] at the optimum.
    """
    x, y, mask = (np.atleast_2d(np.asarray(v)) for v in (x, y, mask))
    mask = mask.astype(bool)
    y = np.where(mask, y, 0.0)
    lu = np.log(np.where(mask, x, x_ref) / x_ref)
    B = y.shape[0]
    grid = _grid(np.where(mask, y, np.nan), mask, alpha_max)
    e_hi = np.where(mask, y, -np.inf).max(axis=-1)
    f0, _ = _model(grid, lu[:, None, :])
    ranked = np.argsort(objective(y[:, None] - f0, mask[:, None], loss, delta), axis=1)
    keep = min(keep, grid.shape[1])
    cands = np.take_along_axis(grid, ranked[:, :keep, None], axis=1)
    if starts is not None:
        s = np.asarray(starts, dtype=np.float64).reshape(B, 1, 3).copy()
        s[..., 0] = np.log(np.maximum(s[..., 0], E_FLOOR))
        s[..., 1] = np.log(np.maximum(s[..., 1], 1e-300)) - s[..., 2] * math.log(x_ref)
        cands = np.concatenate([cands, s], axis=1)
    K = cands.shape[1]
    rep = lambda v: np.repeat(v, K, axis=0)  # noqa: E731
    theta, obj = _levenberg_marquardt(
        cands.reshape(B * K, 3),
        rep(lu),
        rep(y),
        rep(mask),
        loss=loss,
        delta=delta,
        e_hi=rep(e_hi),
        alpha_max=alpha_max,
    )
    theta, obj = theta.reshape(B, K, 3), obj.reshape(B, K)
    best = np.argmin(obj, axis=1)
    th = theta[np.arange(B), best]
    params = np.stack(
        [np.exp(th[:, 0]), np.exp(th[:, 1] + th[:, 2] * math.log(x_ref)), th[:, 2]], axis=1
    )
    return params, obj[np.arange(B), best]


def fit_one(
    x: np.ndarray,
    y: np.ndarray,
    *,
    loss: str = "huber",
    delta: float = 1e-3,
    alpha_max: float = 2.0,
) -> PowerLaw:
    """The fit of one set of points (x, log-loss), from every grid start."""
    x = np.asarray(x, dtype=np.float64)
    x_ref = float(np.exp(np.log(x).mean()))
    params, _ = fit_power_laws(
        x,
        y,
        np.ones_like(x, dtype=bool),
        x_ref=x_ref,
        loss=loss,
        delta=delta,
        alpha_max=alpha_max,
        keep=len(E_FRACTIONS) * len(A_FRACTIONS) * len(ALPHAS),
    )
    E, A, alpha = params[0]
    return PowerLaw(float(E), float(A), float(alpha))
