"""Calibrated Stage-1 scores: a monotone map from a filter's score to P(resolved), and its error.

``fit_calibration(scores, labels)`` fits the map on labelled calibration candidates (scores that
were computed as for new pools: cross-fitted, or by a bank that has not seen them); a
``CalibrationMap`` predicts probabilities, is saved as JSON (``to_dict`` / ``from_dict``) and is
monotone non-decreasing in the score, so a threshold on the probability is a threshold on the
score (what ``latentsift.deploy.operating`` relies on). Methods:

- "isotonic" (the default): isotonic regression (``sklearn.isotonic.IsotonicRegression``), a
  non-decreasing step function fitted by least squares (pool-adjacent-violators). No shape is
  assumed; the Stage-1 scores are within-pool ranks with a few distinct values per pool size, which
  is what a step function fits without forcing a logistic curve through them.
- "platt": a one-feature logistic regression (Platt scaling), smoother and steadier on a small
  calibration set, but it assumes the log-odds are linear in the score.

Calibration error: ``ece`` (expected calibration error, equal-width probability bins, optionally
under bootstrap weights, vectorised over resamples), ``ece_ci`` (with a bootstrap interval over
pools: ``evaluate.bootstrap_weights``, the project's one resampler) and ``reliability`` (the bins
of the reliability figure).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError, check_choice
from .bootstrap import CI_LEVEL, bootstrap_weights

CALIBRATION_METHODS = ("isotonic", "platt")
N_BINS = 10


@dataclass
class CalibrationMap:
    """A fitted map score -> P(resolved).

    isotonic: ``x`` / ``y`` the step function's knots (linear between knots, clipped outside, as
    sklearn predicts); platt: ``x = [slope]``, ``y = [intercept]`` of the log-odds. ``n`` / ``n_pos``:
    calibration candidates and resolved ones. NaN scores map to the lowest probability.
    """

    method: str
    x: list[float]
    y: list[float]
    n: int
    n_pos: int

    def predict(self, scores: Any) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        s = np.where(np.isnan(s), -np.inf, s)
        if self.method == "platt":
            z = np.clip(self.x[0] * np.where(np.isfinite(s), s, np.sign(s) * 1e6) + self.y[0], -500, 500)
            return 1.0 / (1.0 + np.exp(-z))
        return np.interp(s, np.asarray(self.x), np.asarray(self.y))

    def to_dict(self) -> dict:
        return {"method": self.method, "x": list(map(float, self.x)), "y": list(map(float, self.y)),
                "n": int(self.n), "n_pos": int(self.n_pos)}

    @classmethod
    def from_dict(cls, d: dict) -> "CalibrationMap":
        return cls(d["method"], list(d["x"]), list(d["y"]), int(d["n"]), int(d["n_pos"]))


@blas_fixed
def fit_calibration(scores: Sequence[float], labels: Sequence[int], method: str = "isotonic") -> CalibrationMap:
    """The calibration map of ``method`` fitted on candidates' ``scores`` and 0/1 ``labels``."""
    check_choice(method, "method", "fit_calibration", CALIBRATION_METHODS)
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if s.shape != y.shape or s.ndim != 1:
        raise LatentSiftError(f"fit_calibration needs one label per score. Got {s.shape} scores and {y.shape} labels.")
    ok = np.isfinite(s)
    s, y = s[ok], y[ok]
    if s.size == 0:
        raise LatentSiftError("fit_calibration needs at least one calibration candidate with a finite score. Got 0.")
    n_pos = int(y.sum())
    if n_pos in (0, s.size) or np.unique(s).size < 2:  # nothing to fit: the constant base rate
        return CalibrationMap(method, [0.0] if method == "platt" else [float(s.min())],
                              [float(np.log(max(y.mean(), 1e-12) / max(1 - y.mean(), 1e-12)))] if method == "platt"
                              else [float(y.mean())], int(s.size), n_pos)
    # sklearn imports scipy (~0.5 s): loaded on first use, so that the command line starts without it
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(s, y)
        return CalibrationMap(method, iso.X_thresholds_.tolist(), iso.y_thresholds_.tolist(), int(s.size), n_pos)
    from sklearn.linear_model import LogisticRegression
    lr = LogisticRegression(C=1e4).fit(s[:, None], y.astype(int))
    return CalibrationMap(method, [float(lr.coef_[0, 0])], [float(lr.intercept_[0])], int(s.size), n_pos)


def bin_index(p: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Equal-width bin of each probability in [0, 1] (1.0 falls in the last bin)."""
    return np.minimum((np.asarray(p, dtype=np.float64) * n_bins).astype(np.int64), n_bins - 1)


def ece(p: Any, y: Any, weights: Any = None, n_bins: int = N_BINS) -> np.ndarray | float:
    """Expected calibration error: sum over bins of |sum w (p - y)| / sum w.

    ``weights``: None (one number), or (n_boot, n) per-candidate weights (one ECE per row).
    """
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    onehot = np.eye(n_bins)[bin_index(p, n_bins)]                 # (n, bins)
    w = np.ones((1, p.size)) if weights is None else np.asarray(weights, dtype=np.float64)
    gap = np.abs((w * (p - y)) @ onehot).sum(axis=1)              # (rows,)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = gap / w.sum(axis=1)
    return float(out[0]) if weights is None else out


def ece_ci(p: Any, y: Any, groups: Sequence[str], *, n_boot: int = 1000, seed: int = 0,
           n_bins: int = N_BINS, level: float = CI_LEVEL) -> dict[str, float]:
    """ECE and its bootstrap percentile interval, resampling pools (``groups``: each candidate's pool)."""
    g = np.asarray(groups)
    if g.size == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    uniq, inv = np.unique(g, return_inverse=True)
    w = bootstrap_weights(len(uniq), n_boot, np.random.default_rng(seed))[:, inv]
    stats = ece(p, y, w, n_bins)
    ok = stats[np.isfinite(stats)]
    lo, hi = np.percentile(ok, [50 * (1 - level), 50 * (1 + level)]) if ok.size else (np.nan, np.nan)
    return {"mean": ece(p, y, None, n_bins), "lo": float(lo), "hi": float(hi), "n": int(np.asarray(p).size)}


def reliability(p: Any, y: Any, n_bins: int = N_BINS) -> dict[str, list]:
    """Per non-empty bin: mean predicted probability, share resolved, count (the reliability figure)."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    b = bin_index(p, n_bins)
    cnt = np.bincount(b, minlength=n_bins)
    sp = np.bincount(b, weights=p, minlength=n_bins)
    sy = np.bincount(b, weights=y, minlength=n_bins)
    m = cnt > 0
    return {"mean_p": (sp[m] / cnt[m]).tolist(), "frac_resolved": (sy[m] / cnt[m]).tolist(),
            "count": cnt[m].tolist()}
