"""The error of calibrated Stage-1 scores (the map itself, ``CalibrationMap`` / ``fit_calibration``
and its registered methods, is ``latentsift.sift.calibration``, re-exported here).

Calibration error: ``ece`` (expected calibration error, equal-width probability bins, optionally
under bootstrap weights, vectorised over resamples), ``ece_ci`` (with a bootstrap interval over
pools: ``evaluate.bootstrap_weights``, the project's one resampler) and ``reliability`` (the bins
of the reliability figure).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .bootstrap import CI_LEVEL, bootstrap_weights
from ..sift.calibration import CalibrationMap, fit_calibration

__all__ = ["CalibrationMap", "N_BINS", "bin_index", "ece", "ece_ci", "fit_calibration", "reliability"]

N_BINS = 10


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
