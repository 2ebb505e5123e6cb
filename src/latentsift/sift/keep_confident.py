"""The high-probability recall-targeted keep rule: Learn then Test with a binomial tail.

``RecallKeep`` promises the *expected* pool recall (over the draw of calibration and new pools).
``ConfidentRecallKeep`` promises it with a probability: with probability at least 1 - delta over the
draw of the n calibration pools (exchangeable with the new pools), the rule's pool recall on new
pools -- the probability that a new pool holding a resolved candidate keeps one -- is at least R.

Learn then Test (Angelopoulos, Bates, Candès, Jordan and Lei, "Learn then Test: Calibrating
Predictive Algorithms to Achieve Risk Control", 2021), with the 0/1 pool loss of ``keep`` and
alpha = 1 - R. For each threshold tau, the null hypothesis H_tau: risk(tau) > alpha, and the
binomial-tail p-value

    p(tau) = P(Binomial(n, alpha) <= n R_hat_n(tau)),

valid because n R_hat_n(tau), the calibration pools lost at tau, is Binomial(n, risk(tau)), which
under H_tau is stochastically larger than Binomial(n, alpha). The loss grows with tau, so p(tau)
does too: fixed-sequence testing from the lowest threshold upward at level delta (no multiplicity
correction needed) rejects every tau up to the last with p(tau) <= delta, and the rule takes the
largest. In closed form: at most

    m* = max{ m : P(Binomial(n, alpha) <= m) <= delta }                  (``ltt_allowed_losses``)

calibration pools may lose their resolved candidates, and tau_hat is the (m* + 1)-th smallest pool
miss score (``ltt_threshold``; ``keep.crc_threshold`` is the same order statistic with the expected
mode's count floor(alpha (n + 1) - 1)). The bound needs (1 - alpha)^n <= delta (m* >= 0), i.e.

    n >= log(delta) / log(1 - alpha)                                      (``min_confident_pools``)

pools holding a resolved candidate: 22 for R = 0.9 at delta = 0.1, 29 at delta = 0.05; 45 and 59
for R = 0.95; 230 and 299 for R = 0.99. A smaller calibration set is refused.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._core.registry import registry_add
from .._core.validation import LatentSiftError
from .keep import CalibrationPools, RecallKeep
from .calibration import DEFAULT_CALIBRATION
from .retain import TARGET_MIN_KEEP

CONFIDENT_GUARANTEE = ("Learn then Test (Angelopoulos et al., 2021) with a binomial-tail p-value and fixed-sequence "
                       "testing: with probability >= 1 - delta over the draw of the calibration pools, the pool recall "
                       "of new pools exchangeable with them (the probability that a new pool holding a resolved "
                       "candidate keeps one) is >= R")


def check_confidence(value: Any, owner: str = "filter") -> float:
    """A confidence level 1 - delta in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 < float(value) < 1.0:
        raise LatentSiftError(f"The 'confidence' parameter of {owner} must be a number in (0, 1), e.g. 0.9 for "
                              f"delta = 0.1. Got {value!r} instead.")
    return float(value)


def min_confident_pools(target: float, confidence: float) -> int:
    """Fewest calibration pools holding a resolved candidate for which the bound exists: (1 - alpha)^n <= delta."""
    alpha, delta = 1.0 - target, 1.0 - confidence
    if alpha <= 0:
        return 0
    return max(1, math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-9))


def binom_cdf(m: np.ndarray, n: int, p: float) -> np.ndarray:
    """P(Binomial(n, p) <= m), vectorised over m (``scipy.stats.binom``)."""
    # scipy loads with scikit-learn (~0.5 s): imported on first use, so that the command line starts without it
    from scipy.stats import binom
    return binom.cdf(np.asarray(m), n, p)


def ltt_allowed_losses(n: int, alpha: float, delta: float) -> int:
    """m*: the most calibration pools (of n) the threshold may lose; -1 when no m passes (too few pools)."""
    if alpha <= 0 or n <= 0:
        return -1
    ok = np.flatnonzero(binom_cdf(np.arange(n + 1), n, alpha) <= delta)
    return int(ok.max()) if ok.size else -1


def ltt_threshold(u: Any, alpha: float, delta: float) -> float:
    """The Learn-then-Test threshold from the calibration pools' miss scores ``u`` (``keep.pool_miss_score``):
    the largest threshold at which at most m* of them are lost (+inf: ``min_keep`` per pool; -inf: keep all)."""
    u = np.sort(np.asarray(u, dtype=np.float64))
    if alpha <= 0:
        return float("-inf")
    m = ltt_allowed_losses(u.size, alpha, delta)
    if m < 0:
        raise LatentSiftError(f"Learn then Test at R = {1 - alpha:g}, confidence {1 - delta:g} needs n >= "
                              f"{min_confident_pools(1 - alpha, 1 - delta)} calibration pools; got {u.size}.")
    return float("inf") if m >= u.size else float(u[m])


class ConfidentRecallKeep(RecallKeep):
    """Per pool the ``min_keep`` best and every candidate whose score reaches a threshold chosen so that
    P(pool recall >= ``target_recall``) >= ``confidence`` (module docstring); fitted like ``RecallKeep``."""

    name = "confident-recall"
    guarantee = CONFIDENT_GUARANTEE

    def __init__(self, target_recall: float = 0.9, confidence: float = 0.9, min_keep: int = TARGET_MIN_KEEP,
                 calibration: str = DEFAULT_CALIBRATION, seed: int = 0):
        super().__init__(target_recall, min_keep=min_keep, calibration=calibration, seed=seed)
        self.confidence = check_confidence(confidence, "ConfidentRecallKeep")

    @property
    def delta(self) -> float:
        return 1.0 - self.confidence

    def min_pools(self) -> int:
        return min_confident_pools(self.target_recall, self.confidence)

    def allowed_losses(self, n: int) -> int:
        return ltt_allowed_losses(n, self.alpha, self.delta)

    def fit(self, pools: CalibrationPools) -> "ConfidentRecallKeep":
        u = self._miss_scores(pools)
        need = self.min_pools()
        if self.target_recall < 1.0 and u.size < need:
            raise LatentSiftError(f"filter: --target-recall {self.target_recall:g} --confidence {self.confidence:g} "
                                  f"needs at least {need} calibration pools that hold a resolved candidate (Learn then "
                                  f"Test: n >= log(delta) / log(R)); the calibration set has {u.size}. Add labelled "
                                  "pools, lower the target or the confidence.")
        return self._fitted(pools, u, ltt_threshold(u, self.alpha, self.delta), self.allowed_losses(u.size))

    def to_dict(self) -> dict:
        return super().to_dict() | {"confidence": self.confidence, "delta": round(self.delta, 12),
                                    "n_calibration_pools_needed": min_confident_pools(self.target_recall,
                                                                                      self.confidence)}


registry_add("keep_rule", "confident-recall", ConfidentRecallKeep)
