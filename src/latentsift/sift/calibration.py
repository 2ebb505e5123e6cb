"""Calibrated Stage-1 scores: a monotone map from a filter's score to P(resolved).

``fit_calibration(scores, labels)`` fits the map on labelled calibration candidates (scores that
were computed as for new pools: cross-fitted, or by a bank that has not seen them); a
``CalibrationMap`` predicts probabilities, is saved as JSON (``to_dict`` / ``from_dict``) and is
monotone non-decreasing in the score, so a threshold on the probability is a threshold on the
score (what the recall-targeted keep rule, ``latentsift.sift.keep``, relies on). The methods are
registered calibration methods (``latentsift._core.registry``, kind "calibration"):

- "isotonic" (the default): isotonic regression (``sklearn.isotonic.IsotonicRegression``), a
  non-decreasing step function fitted by least squares (pool-adjacent-violators). No shape is
  assumed; the Stage-1 scores are within-pool ranks with a few distinct values per pool size, which
  is what a step function fits without forcing a logistic curve through them.
- "platt": a one-feature logistic regression (Platt scaling), smoother and steadier on a small
  calibration set, but it assumes the log-odds are linear in the score.

A method is an object with ``fit(s, y) -> (x, y)`` (the map's parameters, on finite scores of both
classes), ``constant(y) -> (x, y)`` (the map of a single class or a single score),
``predict(x, y, s) -> p`` (s with -inf for NaN) and optionally ``domain(x) -> (lo, hi)`` (the range of the
calibration scores as far as the parameters tell; a saved threshold outside it was not fitted there).
Calibration *error* (ECE, reliability) is measured in ``latentsift.metrics.calibrate``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._core.registry import registry_add, registry_lookup, registry_names
from .._core.threads import blas_fixed
from .._core.validation import LatentSiftError, check_choice


class IsotonicCalibration:
    """Isotonic regression: ``x`` / ``y`` the step function's knots (linear between knots, clipped outside,
    as sklearn predicts)."""

    @staticmethod
    def fit(s: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
        # sklearn imports scipy (~0.5 s): loaded on first use, so that the command line starts without it
        from sklearn.isotonic import IsotonicRegression
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(s, y)
        return iso.X_thresholds_.tolist(), iso.y_thresholds_.tolist()

    @staticmethod
    def constant(s: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
        return [float(s.min())], [float(y.mean())]

    @staticmethod
    def predict(x: list[float], y: list[float], s: np.ndarray) -> np.ndarray:
        return np.interp(s, np.asarray(x), np.asarray(y))

    @staticmethod
    def domain(x: list[float]) -> tuple[float, float]:
        """The calibration scores' range: the first and last knots (one knot: the lowest score)."""
        return float(x[0]), float(x[-1]) if len(x) > 1 else float("inf")


class PlattCalibration:
    """Platt scaling: ``x = [slope]``, ``y = [intercept]`` of the log-odds."""

    @staticmethod
    def fit(s: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
        from sklearn.linear_model import LogisticRegression
        lr = LogisticRegression(C=1e4).fit(s[:, None], y.astype(int))
        return [float(lr.coef_[0, 0])], [float(lr.intercept_[0])]

    @staticmethod
    def constant(s: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
        return [0.0], [float(np.log(max(y.mean(), 1e-12) / max(1 - y.mean(), 1e-12)))]

    @staticmethod
    def predict(x: list[float], y: list[float], s: np.ndarray) -> np.ndarray:
        z = np.clip(x[0] * np.where(np.isfinite(s), s, np.sign(s) * 1e6) + y[0], -500, 500)
        return 1.0 / (1.0 + np.exp(-z))

    @staticmethod
    def domain(x: list[float]) -> tuple[float, float]:
        """Unknown from the map's parameters: every score."""
        return float("-inf"), float("inf")


#: The default method: the first registered.
DEFAULT_CALIBRATION = "isotonic"
registry_add("calibration", DEFAULT_CALIBRATION, IsotonicCalibration)
registry_add("calibration", "platt", PlattCalibration)


def calibration_methods() -> tuple[str, ...]:
    """Every registered calibration method (``filter --calibration-method``)."""
    return registry_names("calibration")


@dataclass
class CalibrationMap:
    """A fitted map score -> P(resolved) of a registered ``method`` (its parameters ``x`` / ``y``).

    ``n`` / ``n_pos``: calibration candidates and resolved ones. NaN scores map to the lowest probability.
    """

    method: str
    x: list[float]
    y: list[float]
    n: int
    n_pos: int

    def predict(self, scores: Any) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        s = np.where(np.isnan(s), -np.inf, s)
        return registry_lookup("calibration", self.method).predict(self.x, self.y, s)

    def domain(self) -> tuple[float, float]:
        """The range of the calibration scores as far as the map's parameters tell (the method's ``domain``)."""
        domain = getattr(registry_lookup("calibration", self.method), "domain", None)  # optional for a plugin
        return (float("-inf"), float("inf")) if domain is None else domain(self.x)

    def to_dict(self) -> dict:
        return {"method": self.method, "x": list(map(float, self.x)), "y": list(map(float, self.y)),
                "n": int(self.n), "n_pos": int(self.n_pos)}

    @classmethod
    def from_dict(cls, d: dict) -> "CalibrationMap":
        return cls(d["method"], list(d["x"]), list(d["y"]), int(d["n"]), int(d["n_pos"]))


@blas_fixed
def fit_calibration(scores: Sequence[float], labels: Sequence[int], method: str = DEFAULT_CALIBRATION) -> CalibrationMap:
    """The calibration map of ``method`` fitted on candidates' ``scores`` and 0/1 ``labels``."""
    check_choice(method, "method", "fit_calibration", calibration_methods())
    impl = registry_lookup("calibration", method)
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
        return CalibrationMap(method, *impl.constant(s, y), int(s.size), n_pos)
    return CalibrationMap(method, *impl.fit(s, y), int(s.size), n_pos)
