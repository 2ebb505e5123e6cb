"""Seeded draws and bootstrap intervals: the one home of the resampling every evaluation shares.

Draws of K candidates per (instance, K) are seeded by ``(seed, K, sha256(instance_id))``
(``instance_seed``), so adding an instance never changes the others' draws; ``draw_subsets``
enumerates all C(n, K) subsets when there are at most ``n_draws``. Intervals are percentile
bootstrap intervals (``CI_LEVEL``) over ``N_BOOT`` resamples of instances with replacement
(``bootstrap_indices``; ``bootstrap_weights`` gives the same resamples as multiplicities).
"""
from __future__ import annotations

import hashlib
import math
from itertools import combinations

import numpy as np

N_BOOT = 1000       # bootstrap resamples over instances
CI_LEVEL = 0.95     # percentile interval

__all__ = ["N_BOOT", "CI_LEVEL", "instance_seed", "draw_subsets", "bootstrap_indices", "bootstrap_weights",
           "mean_ci", "ratio_ci"]


# ----------------------------------------------------------------------------- draws
def instance_seed(seed: int, k: int, instance_id: str) -> np.random.Generator:
    """Generator for the draws of one (instance, K): seeded by (seed, K, sha256(instance_id))."""
    h = int.from_bytes(hashlib.sha256(instance_id.encode()).digest()[:8], "big")
    return np.random.default_rng([int(seed), int(k), h])


def draw_subsets(n: int, k: int, n_draws: int, rng: np.random.Generator, *, exact: bool = True
                 ) -> tuple[list[tuple[int, ...]], bool]:
    """Index subsets of size k from range(n): all C(n, k) when ``exact`` and C(n, k) <= n_draws,
    else ``n_draws`` seeded draws without replacement (sorted indices). Returns (subsets, exact)."""
    if exact and math.comb(n, k) <= n_draws:
        return list(combinations(range(n), k)), True
    return [tuple(sorted(int(i) for i in rng.choice(n, size=k, replace=False))) for _ in range(n_draws)], False


# ----------------------------------------------------------------------------- statistics

def bootstrap_indices(n_items: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n_items) resample indices of instances with replacement: the one bootstrap resampler."""
    return rng.integers(0, n_items, size=(n_boot, n_items))


def bootstrap_weights(n_items: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """The resamples of :func:`bootstrap_indices` (the same draws) as (n_boot, n_items) float
    multiplicities, each row summing to n_items: for metrics computed under instance weights."""
    idx = bootstrap_indices(n_items, n_boot, rng)
    flat = idx + (np.arange(n_boot) * n_items)[:, None]
    return np.bincount(flat.ravel(), minlength=n_boot * n_items).reshape(n_boot, n_items).astype(np.float64)


def mean_ci(values: np.ndarray, boot: np.ndarray, level: float = CI_LEVEL) -> dict[str, float]:
    """Mean over instances and its bootstrap percentile interval."""
    v = np.asarray(values, dtype=np.float64)
    stats = v[boot].mean(axis=1)
    lo, hi = np.percentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return {"mean": float(v.mean()), "lo": float(lo), "hi": float(hi)}


def ratio_ci(num: np.ndarray, den: np.ndarray, boot: np.ndarray, level: float = CI_LEVEL) -> dict[str, float]:
    """sum(num) / sum(den) over instances (a ratio estimator) and its bootstrap interval."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    d = den[boot].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        stats = np.where(d > 0, num[boot].sum(axis=1) / np.where(d > 0, d, 1), np.nan)
    total = den.sum()
    mean = float(num.sum() / total) if total > 0 else float("nan")
    ok = stats[np.isfinite(stats)]
    lo, hi = (np.percentile(ok, [50 * (1 - level), 50 * (1 + level)]) if ok.size else (np.nan, np.nan))
    return {"mean": mean, "lo": float(lo), "hi": float(hi)}
