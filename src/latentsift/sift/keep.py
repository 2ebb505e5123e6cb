"""Keep rules: which candidates of a scored pool Stage 1 keeps (the retention policy).

A keep rule is an estimator in the scikit-learn manner::

    rule = RecallKeep(0.9).fit(calibration_pools)   # learn what it needs from labelled pools
    mask = rule.keep(scores, traj_ids)               # then decide per pool: a boolean mask

- ``fit(pools: CalibrationPools) -> self``: learn from labelled calibration pools (scored as new
  pools would be); a rule with nothing to learn returns itself unchanged.
- ``keep(scores, traj_ids) -> np.ndarray`` (bool, one per candidate): the candidates kept, at least
  one of a non-empty pool. NaN scores rank lowest; ties are broken by ``retain.order_by_score``'s
  (seed, traj_id) hash, so the decision does not depend on candidate order.
- ``count(k) -> int | None``: how many of a pool of K it keeps when that depends on K alone (the
  paper's rule; evaluation then takes the top of a pool-wide order), None otherwise.
- ``get_params(deep=True)`` / ``set_params(**p)`` (``sklearn.base.clone`` works: ``_core.estimator``) and
  ``to_dict()``: the settings, and settings plus what was fitted (for the files).

Two rules are built in and registered (``latentsift._core.registry``, kind "keep_rule"):

- ``FixedKeep`` ("fixed"): the paper's ``max(3, floor(K/2))`` best (all when K <= 3; ``retain``).
- ``RecallKeep`` ("target-recall"): a threshold chosen on calibration pools for a target pool recall
  R with conformal risk control (below); per pool the ``min_keep`` best and every candidate whose
  score reaches the threshold.

A new retention policy is one module with a ``KeepRule`` subclass and one ``registry_add("keep_rule",
name, cls)``; ``keep_rule(name, **params)`` builds any registered one.

**The recall-targeted rule.** Pool recall: the share of pools that hold a resolved candidate and
keep at least one of them. A target recall R is a risk level alpha = 1 - R on the loss

    L_i(tau) = 1[pool i holds a resolved candidate and Stage 1 keeps none of them],

where pool i keeps its ``min_keep`` best candidates and every candidate whose score is at least the
threshold ``tau`` (``keep_mask``): a confident pool (one candidate far above the rest) keeps one,
an uncertain pool (every candidate above the threshold) keeps all. L_i grows with tau (a higher
threshold keeps fewer candidates) and is bounded by B = 1.

Conformal risk control (Angelopoulos, Bates, Fisch, Lei and Schuster, "Conformal Risk Control",
ICLR 2024, Theorem 1), on the n calibration pools that hold a resolved candidate: with
lambda = -tau (so the loss is non-increasing in lambda),

    tau_hat = sup{ tau : (n / (n + 1)) R_hat_n(tau) + B / (n + 1) <= alpha },

i.e. at most ``floor(alpha (n + 1) - 1)`` calibration pools may lose their resolved candidates
(``crc_threshold``, closed form: an order statistic of each pool's best resolved score,
``pool_miss_score``). Then, when the calibration pools and a new pool holding a resolved
candidate are exchangeable, E[L_new(tau_hat)] <= alpha, i.e. the expected pool recall is at
least R. The bound needs ``alpha (n + 1) >= 1`` (``n >= 1 / alpha - 1``; a smaller calibration
set is refused, ``check_calibration_size``); R = 1 keeps every candidate (trivially guaranteed).

The keep decision is made on the score, and the calibrated probability (``sift.calibration``, a
non-decreasing map fitted on the same pools) is reported with it: the candidates kept are those
whose probability is at least the threshold's, up to the plateaus of the isotonic step function,
which a threshold on the probability would keep whole (still valid, but it keeps more than the
guarantee needs).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .._core.estimator import Estimator
from .._core.registry import registry_add, registry_lookup, registry_names
from .._core.validation import LatentSiftError, NotFittedError, check_choice, check_positive_int
from .calibration import DEFAULT_CALIBRATION, calibration_methods, fit_calibration
from .retain import (KEEP_FRAC, MIN_KEEP, TARGET_MIN_KEEP, check_retention, retain_count, retain_rule_text,
                     select_retained)

GUARANTEE = ("conformal risk control (Angelopoulos et al., Conformal Risk Control, Theorem 1): "
             "E[1 - pool recall] <= 1 - R for a new pool holding a resolved candidate, when it and the "
             "calibration pools holding one are exchangeable")


@dataclass
class CalibrationPools:
    """Labelled pools scored as new pools: per pool its traj_ids, scores and 0/1 labels."""

    instance_ids: list[str]
    traj_ids: list[list[str]]
    scores: list[np.ndarray]
    labels: list[np.ndarray]
    how: str = ""
    extra: dict = field(default_factory=dict)

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.scores:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(self.scores), np.concatenate(self.labels)

    def n_positive(self) -> int:
        return int(sum(np.asarray(y).any() for y in self.labels))

    def pool_sizes(self) -> list[int] | None:
        """[smallest K, largest K] of the pools (None without pools): the sizes a guarantee was calibrated on."""
        k = [len(t) for t in self.traj_ids]
        return [min(k), max(k)] if k else None


class KeepRule(Estimator, ABC):
    """Which candidates of a scored pool Stage 1 keeps (module docstring)."""

    #: the registered name
    name: str = "keep-rule"

    def fit(self, pools: CalibrationPools) -> "KeepRule":
        """Learn from labelled calibration pools; a rule with nothing to learn returns itself."""
        return self

    @abstractmethod
    def keep(self, scores: Any, traj_ids: Sequence[str]) -> np.ndarray:
        """Boolean mask of the candidates kept (one per score)."""

    def count(self, k: int) -> int | None:
        """Candidates kept of any pool of ``k`` when that depends on K alone, else None."""
        return None

    def to_dict(self) -> dict:
        """The settings and what was fitted, for the files."""
        return {"rule": self.name, **self.get_params()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"


class FixedKeep(KeepRule):
    """The paper's rule: keep the ``max(min_keep, floor(frac * K))`` best of a pool (all when K <= min_keep).

    Nothing to fit. Ties at the cut by ``retain.order_by_score`` (higher score first, then the
    (``seed``, traj_id) hash).
    """

    name = "fixed"

    def __init__(self, min_keep: int = MIN_KEEP, frac: float = KEEP_FRAC, seed: int = 0):
        self.min_keep, self.frac = check_retention(min_keep, frac, "FixedKeep (--min-keep/--frac)")
        self.seed = seed

    def keep(self, scores: Any, traj_ids: Sequence[str]) -> np.ndarray:
        return select_retained(scores, traj_ids, seed=self.seed, min_keep=self.min_keep, frac=self.frac)

    def count(self, k: int) -> int:
        return retain_count(k, self.min_keep, self.frac)

    def describe(self) -> str:
        """The rule in words: "max(3, floor(K/2))" for the paper's settings."""
        return retain_rule_text(self.min_keep, self.frac)


# ---------------------------------------------------------------------- the recall-targeted rule
def check_target_recall(value: Any, owner: str = "filter") -> float:
    """A target pool recall in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 < float(value) <= 1.0:
        raise LatentSiftError(f"The 'target_recall' parameter of {owner} must be a number in (0, 1]. "
                              f"Got {value!r} instead.")
    return float(value)


def min_calibration_pools(target: float) -> int:
    """Fewest calibration pools holding a resolved candidate for which the bound can hold: n >= 1/alpha - 1."""
    alpha = 1.0 - target
    return 0 if alpha <= 0 else max(1, math.ceil(1.0 / alpha - 1.0 - 1e-9))


def check_calibration_size(n: int, target: float, owner: str = "filter") -> None:
    """Refuse a calibration set too small for conformal risk control at ``target``."""
    need = min_calibration_pools(target)
    if target < 1.0 and n < need:
        raise LatentSiftError(f"{owner}: --target-recall {target:g} needs at least {need} calibration pools that "
                              f"hold a resolved candidate (conformal risk control: n >= 1/(1 - R) - 1); the "
                              f"calibration set has {n}. Add labelled pools or lower the target.")


def top_mask(scores: np.ndarray, traj_ids: Sequence[str], n: int, seed: int = 0) -> np.ndarray:
    """The ``n`` best candidates under the retention tie rule (``retain.select_retained``; none when n < 1)."""
    if n < 1:
        return np.zeros(len(traj_ids), dtype=bool)
    return select_retained(scores, traj_ids, n_keep=n, seed=seed)


def keep_mask(scores: Any, traj_ids: Sequence[str], threshold: float, min_keep: int = TARGET_MIN_KEEP,
              seed: int = 0) -> np.ndarray:
    """Candidates kept: the ``min_keep`` best, and every candidate with score >= ``threshold``."""
    s = np.asarray(scores, dtype=np.float64)
    return top_mask(s, traj_ids, min_keep, seed) | (np.nan_to_num(s, nan=-np.inf) >= threshold)


def pool_miss_score(scores: Any, labels: Any, traj_ids: Sequence[str], min_keep: int = TARGET_MIN_KEEP,
                    seed: int = 0) -> float:
    """u such that the pool loses its resolved candidates exactly when the threshold exceeds u.

    +inf when a resolved candidate is among the ``min_keep`` best (never lost); else the best score of
    a resolved candidate (NaN scores count as -inf); NaN when the pool holds no resolved candidate.
    """
    raw = np.asarray(scores, dtype=np.float64)
    s = np.nan_to_num(raw, nan=-np.inf)
    y = np.asarray(labels).astype(bool)
    if not y.any():
        return float("nan")
    if (top_mask(raw, traj_ids, min_keep, seed) & y).any():
        return float("inf")
    return float(s[y].max())


def crc_threshold(u: Any, alpha: float) -> float:
    """The conformal-risk-control threshold for the 0/1 pool loss 1[tau > u_i] (module docstring).

    ``u``: ``pool_miss_score`` of the n calibration pools holding a resolved candidate. Returns the
    largest threshold at which at most floor(alpha (n + 1) - 1) of them are lost: +inf keeps only
    ``min_keep`` per pool, -inf keeps everything (alpha = 0).
    """
    u = np.sort(np.asarray(u, dtype=np.float64))
    n = u.size
    if alpha <= 0:
        return float("-inf")
    allowed = math.floor(alpha * (n + 1) - 1 + 1e-9)
    if allowed < 0:
        raise LatentSiftError(f"conformal risk control at alpha {alpha:g} needs n >= {min_calibration_pools(1 - alpha)} "
                              f"calibration pools; got {n}.")
    return float("inf") if allowed >= n else float(u[allowed])


class RecallKeep(KeepRule):
    """Keep, per pool, the ``min_keep`` best and every candidate whose score reaches a threshold chosen on
    calibration pools for ``target_recall`` by conformal risk control (module docstring).

    ``calibration``: the registered calibration method of the probabilities reported beside the
    scores. Fitted attributes: ``threshold_`` (on the score), ``p_threshold_`` (the calibrated
    probability there), ``n_calibration_pools_`` (calibration pools holding a resolved candidate, the
    n of the bound), ``n_lost_allowed_`` (how many of those the threshold may lose), ``calibration_``
    (the ``CalibrationMap``). ``fit`` refuses a calibration set too small for the bound.
    """

    name = "target-recall"
    guarantee = GUARANTEE

    def __init__(self, target_recall: float = 0.9, min_keep: int = TARGET_MIN_KEEP,
                 calibration: str = DEFAULT_CALIBRATION, seed: int = 0):
        self.target_recall = check_target_recall(target_recall, "RecallKeep")
        self.min_keep = check_positive_int(min_keep, "min_keep", "RecallKeep")
        self.calibration = check_choice(calibration, "calibration", "RecallKeep", calibration_methods())
        self.seed = seed

    @property
    def alpha(self) -> float:
        return 1.0 - self.target_recall

    def threshold_scores(self, scores: Any) -> np.ndarray:
        """The scores the threshold is on: the filter's scores themselves (a subclass may transform a pool's
        scores, e.g. ``keep_adaptive.GapRecallKeep``)."""
        return np.asarray(scores, dtype=np.float64)

    def fit(self, pools: CalibrationPools) -> "RecallKeep":
        u = self._miss_scores(pools)
        check_calibration_size(u.size, self.target_recall, "filter")
        return self._fitted(pools, u, crc_threshold(u, self.alpha), self.allowed_losses(u.size))

    def min_pools(self) -> int:
        """The fewest calibration pools holding a resolved candidate that the bound needs."""
        return min_calibration_pools(self.target_recall)

    def allowed_losses(self, n: int) -> int:
        """How many of ``n`` calibration pools the threshold may lose (-1: none, keep all)."""
        return -1 if self.target_recall >= 1 else math.floor(self.alpha * (n + 1) - 1 + 1e-9)

    def _miss_scores(self, pools: CalibrationPools) -> np.ndarray:
        """``pool_miss_score`` of every calibration pool holding a resolved candidate."""
        u = np.array([pool_miss_score(self.threshold_scores(s), y, t, self.min_keep, self.seed)
                      for s, y, t in zip(pools.scores, pools.labels, pools.traj_ids)])
        return u[~np.isnan(u)]

    def _fitted(self, pools: CalibrationPools, u: np.ndarray, threshold: float, allowed: int) -> "RecallKeep":
        """Set the fitted attributes from the miss scores ``u``, the chosen threshold and the pools it may lose."""
        scores = [self.threshold_scores(s) for s in pools.scores]
        self.calibration_ = fit_calibration(np.concatenate(scores) if scores else np.zeros(0),
                                            pools.flat()[1], method=self.calibration)
        self.threshold_ = threshold
        self.p_threshold_ = (float(self.calibration_.predict([self.threshold_])[0]) if np.isfinite(self.threshold_)
                             else float("nan"))
        self.n_calibration_pools_ = int(u.size)
        self.n_lost_allowed_ = int(max(allowed, 0))
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "threshold_"):
            raise NotFittedError(f"The keep rule {self.name!r} is not fitted yet: fit it on labelled calibration "
                                 "pools first (filter --calibration CAL.jsonl).")

    def keep(self, scores: Any, traj_ids: Sequence[str]) -> np.ndarray:
        self._check_fitted()
        return keep_mask(self.threshold_scores(scores), traj_ids, self.threshold_, self.min_keep, self.seed)

    def predict_proba(self, scores: Any) -> np.ndarray:
        """The calibrated probability of each score."""
        self._check_fitted()
        return self.calibration_.predict(self.threshold_scores(scores))

    def to_dict(self) -> dict:
        self._check_fitted()
        fin = (lambda v: None if not np.isfinite(v) else float(v))
        return {"rule": self.name, "target_recall": self.target_recall, "alpha": round(self.alpha, 12),
                "threshold": fin(self.threshold_),
                "threshold_meaning": "keep all" if self.threshold_ == -np.inf else
                "keep min_keep only" if self.threshold_ == np.inf else "keep score >= threshold",
                "p_threshold": fin(self.p_threshold_), "n_calibration_pools": self.n_calibration_pools_,
                "n_lost_allowed": self.n_lost_allowed_, "min_keep": self.min_keep,
                "calibration": self.calibration_.to_dict(), "guarantee": self.guarantee}


registry_add("keep_rule", "fixed", FixedKeep)
registry_add("keep_rule", "target-recall", RecallKeep)


def keep_rules() -> tuple[str, ...]:
    """Every registered keep rule's name."""
    return registry_names("keep_rule")


def keep_rule(name: str, **params: Any) -> KeepRule:
    """A registered keep rule by name, built with ``params`` (unfitted)."""
    cls = registry_lookup("keep_rule", name)
    if not (isinstance(cls, type) and issubclass(cls, KeepRule)):
        raise LatentSiftError(f"The keep rule {name!r} is registered as {cls!r}, not a KeepRule subclass.")
    return cls(**params)


def apply_keep(results: Sequence[Any], rule: KeepRule) -> None:
    """Apply a fitted keep ``rule`` to scored pools (``sift.PoolResult``, changed in place: each candidate's
    ``retained`` and the pool's ``n_keep``)."""
    for res in results:
        ids = [c.traj_id for c in res.candidates]
        mask = rule.keep(np.array([c.s for c in res.candidates], dtype=np.float64), ids)
        for c, m in zip(res.candidates, mask):
            c.retained = bool(m)
        res.n_keep = int(np.sum(mask))


#: The paper's rule with its fixed settings (Stage 1 of the paper; a shared, stateless instance).
PAPER_KEEP = FixedKeep()
